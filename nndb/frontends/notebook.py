"""The notebook's front end: the prompt is ``input()`` (the notebook's input
box), tables are HTML, pictures inline.  IPython is imported only inside
functions."""
from __future__ import annotations

import sys

from .batch import InputFrontend
from ..text import fmt
from ..render import html
from ..render.table import PictureFile, Table

# Why time travel is off in a kernel (--replica): a fork() copies the kernel
# with its threads and sockets, and a respawned replica re-runs the script in
# a process whose prompt would need a terminal the notebook does not have.
KERNEL_NO_REPLICAS = ("in a notebook kernel: forking the kernel is not safe and a respawned replica has no "
                      "terminal for its prompt; 'nndb run SCRIPT' in a terminal has time travel")


def in_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def _display(html_text: str, plain: str) -> None:
    """One output with both an HTML and a plain-text form (IPython picks)."""
    from IPython.display import display
    display({"text/html": html_text, "text/plain": plain}, raw=True)


def table_html(t: Table) -> str:
    """A command's Table as HTML, its cells formatted as the terminal shows them (escaped)."""
    if not t.rows:
        return f"<p>{html.escape(t.empty)}</p>" if t.empty else ""
    title = f"<b>{html.escape(t.title)}</b>" if t.title else ""
    return title + html.table([str(h) for h in t.headers], [[fmt(c) for c in r] for r in t.rows])


class NotebookFrontend(InputFrontend):
    """The session's output in cells: text as the terminal has it, tables as
    HTML, pictures inline; the prompt is ``input()``, which ipykernel answers
    through the notebook's input box.  A client that cannot answer input
    (nbclient, a kernel run headless) gets one line, and the run goes on as
    batch mode would."""

    def __init__(self):
        super().__init__()
        self.session = None            # set by the Session
        self.no_input = False

    def show(self, result) -> bool:
        """Display ``result`` (a command's data); False: let it be printed as text."""
        try:
            if isinstance(result, Table):
                plain = self.session.renderer.render(result) if self.session is not None else ""
                _display(table_html(result), plain)
                return True
            if isinstance(result, (list, tuple)) and any(isinstance(r, Table) for r in result):
                for r in result:
                    if not self.show(r):
                        self.message(str(r))
                return True
            if isinstance(result, PictureFile):
                from IPython.display import Image, display
                self.message(str(result))
                display(Image(filename=result.path))
                return True
        except ImportError:
            return False
        return False

    def read_line(self, prompt: str):
        if not self.no_input:
            try:
                return input(prompt)
            except EOFError:
                return None
            except NotImplementedError:      # IPython's StdinNotImplementedError
                self.no_input = True
                self.error("nndb: this notebook client does not answer input(): the run goes on without a "
                           "prompt (give commands with -e)")
        s = self.session
        return "continue" if s is not None and s.live else None
