"""Text: how nndb shows a number, and text from a file made safe for a terminal.

Numbers: one text form and one JSON form, used by every
renderer (the REPL and batch output, the toolbar, ``nndb inspect``, the JSON
report).

Two things must never look alike: a value that was *not measured* (a
statistic skipped between full steps, a series with no row at a step) and a
value that *is* NaN or infinite.  Not measured is ``None`` in plain data, or
``NOT_MEASURED`` where a float is needed (nndb's ``$`` variables, which
expressions compare): text shows it as ``-`` and JSON as ``null``.  NaN and
Inf are shown as what they are: ``nan``, ``inf``, ``-inf`` in text, and the
strings ``"nan"``, ``"inf"``, ``"-inf"`` in JSON (JSON has no such numbers).

Foreign text: text that came from a file (a trace's metadata, tensor and module names,
event and exception messages) made safe for a terminal.

A terminal obeys the control characters in what it is sent: ESC starts
sequences that clear the screen, move the cursor or retitle the window (OSC,
ended by BEL), C1 characters such as U+009B (CSI) do the same on some
terminals, and a carriage return or backspace rewrites what was printed
before.  ``printable`` shows each such character as a visible escape
(``\\x1b``, ``\\x07``, ``\\x9b``), so the text reads as written and does
nothing.  A backslash is left alone: the text stays readable, and an escape
shown is never mistaken for one sent.

Only the standard library is imported here: every floor of nndb may ask it.
"""
from __future__ import annotations

import json
import math
import re


class _NotMeasured(float):
    """A NaN that says it was not measured: comparisons are false and
    arithmetic gives NaN, as with the NaN the trace stores for it, but it
    prints as what it is."""

    def __repr__(self) -> str:
        return "not measured"

    __str__ = __repr__

    def __reduce__(self):
        return (_not_measured, ())


def _not_measured() -> "_NotMeasured":
    return NOT_MEASURED


NOT_MEASURED = _NotMeasured("nan")


def is_not_measured(x) -> bool:
    return x is None or isinstance(x, _NotMeasured)


def fmt(x) -> str:
    """The text of one value: ``-`` (not measured), ``nan``, ``inf``, ``-inf``,
    a whole number as an integer (a float one of at most 7 significant digits,
    as many as float32 holds: a count; 21943189504.0, a float32 loss whose
    last digits move with the CPU, is ``2.194e+10``), other floats to 4
    significant digits.  A
    float that rounds to fewer digits keeps its zeros (2.99999 is ``3.000``,
    0.0099996 ``0.01000``): ``3`` would say the value is exactly 3, as a
    norm or loss at a threshold is often read; within float32's precision
    of the shorter text (0.3 held as float32) the zeros are dropped."""
    if is_not_measured(x):
        return "-"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        item = getattr(x, "item", None)         # a numpy scalar: its Python number's text
        v = item() if callable(item) and getattr(x, "ndim", None) == 0 else None
        return fmt(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(x)
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e15:
        whole = str(int(x))
        if len(whole.lstrip("-").rstrip("0")) <= 7:
            return whole
    text = f"{x:.4g}"
    return text if abs(float(text) - x) <= 1e-6 * abs(x) else f"{x:#.4g}".replace(".e", "e").rstrip(".")


def fmt_apart(x, y) -> tuple[str, str]:
    """``fmt`` of two numbers compared with each other (a watch's value and its
    threshold), with as many more significant digits as tell them apart where
    ``fmt``'s four do not: 10.8447 against 10.84 read ``10.84 (> 10.84)``."""
    a, b = fmt(x), fmt(y)
    if a != b or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (x, y)) or x == y:
        return a, b
    for digits in range(5, 18):
        a, b = f"{x:.{digits}g}", f"{y:.{digits}g}"
        if a != b:
            break
    return a, b


def json_value(x):
    """``x`` made JSON-safe, recursively: non-finite floats as the strings
    "nan", "inf", "-inf"; not measured (``None``, ``NOT_MEASURED``) as null;
    dict keys as strings; a numpy scalar or other number-like as a number,
    anything else as its ``str``."""
    if is_not_measured(x):
        return None
    if isinstance(x, bool) or isinstance(x, (str, int)):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, dict):
        return {str(k): json_value(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_value(v) for v in x]
    item = getattr(x, "item", None)         # numpy scalars and 0-d arrays
    if callable(item):
        try:
            v = item()
        except (TypeError, ValueError):
            v = None
        if isinstance(v, (bool, int, float)):
            return json_value(v)
    try:
        return json_value(float(x))
    except (TypeError, ValueError):
        return str(x)


def to_json(obj, **kwargs) -> str:
    """``json.dumps`` of ``json_value(obj)``: always valid JSON (no NaN
    literals), control characters escaped (``ensure_ascii``)."""
    return json.dumps(json_value(obj), allow_nan=False, **kwargs)


# -- foreign text ------------------------------------------------------------


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
