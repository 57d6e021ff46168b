"""Text that came from a file (a trace's metadata, tensor and module names,
event and exception messages) made safe for a terminal.

A terminal obeys the control characters in what it is sent: ESC starts
sequences that clear the screen, move the cursor or retitle the window (OSC,
ended by BEL), C1 characters such as U+009B (CSI) do the same on some
terminals, and a carriage return or backspace rewrites what was printed
before.  ``printable`` shows each such character as a visible escape
(``\\x1b``, ``\\x07``, ``\\x9b``), so the text reads as written and does
nothing.  A backslash is left alone: the text stays readable, and an escape
shown is never mistaken for one sent.

Only the standard library is imported here: every renderer may ask it.
"""
from __future__ import annotations

import re

# C0 controls, DEL and the C1 controls; newline and tab are kept where a
# renderer lays out lines (``keep``).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escape(m: "re.Match") -> str:
    return f"\\x{ord(m.group()):02x}"


def printable(text, keep: str = "\n\t") -> str:
    """``text`` (any object: its ``str``) with every control character except
    those in ``keep`` shown as ``\\xNN``."""
    s = text if isinstance(text, str) else str(text)
    if keep:
        return re.sub(_CONTROL, lambda m: m.group() if m.group() in keep else _escape(m), s)
    return _CONTROL.sub(_escape, s)


def printable_line(text) -> str:
    """One line's worth: newlines and tabs escaped too (a name, a message in a table cell)."""
    return printable(text, keep="")
