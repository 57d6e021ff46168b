"""Tab completion from the command table: first decide what kind of thing
comes next (``suggest``), then match names of that kind (pgcli's split)."""
from __future__ import annotations

import fnmatch

from prompt_toolkit.completion import Completer, Completion, PathCompleter
from prompt_toolkit.document import Document

from ..debugger import points as P
from ..commands.inspect import INFO
from ..commands.pictures import PLOT_WORDS
from ..errors import CommandError

KIND_WORDS = tuple(P.WATCH_KINDS)


def suggest(table, text: str):
    """(kind of the word being typed, the words before it, the word itself)."""
    words = text.split()
    current = "" if (not text or text[-1].isspace()) else words.pop()
    if not words:
        return "command", [], current
    try:
        cmd = table.lookup(words[0].partition("/")[0])
    except CommandError:
        return None, words, current
    if cmd.ranks == "option":           # (--ranks all|LIST: anywhere, not an argument position)
        if words[-1] == "--ranks":
            return "sub:all", words, current
        if current.startswith("--"):
            return "sub:--ranks", words, current
        if "--ranks" in words:
            i = words.index("--ranks")
            words = words[:i] + words[i + 2:]
    pos = len(words) - 1
    if cmd.name in ("watch", "stats", "history") and pos >= 1 and words[1] in KIND_WORDS:
        # the tensor names depend on the kind word before them
        pos -= 1 if cmd.name != "watch" else 0
    if cmd.name in ("stats", "history") and pos == 0 and current and current not in KIND_WORDS:
        return "tensor", words, current
    if cmd.name == "plot":
        # plot [WHAT] [KIND] GLOB [STAT]: the names follow the words that choose the picture
        chosen = [w for w in words[1:3] if w in PLOT_WORDS]
        pos -= len(chosen)
        if pos < 0 or (pos == 0 and len(chosen) == 0):
            return cmd.args[0], words, current
        return ("tensor" if pos == 0 else "stat" if pos == 1 else None), words, current
    if pos >= len(cmd.args):
        last = cmd.args[-1] if cmd.args else None
        return (last if last in ("expr", "point") else None), words, current
    return cmd.args[pos], words, current


def _kind_of(words) -> str:
    for w in words[1:]:
        if w in P.WATCH_KINDS:
            return P.WATCH_KINDS[w]
    return ""


def candidates(session, kind: str, words, current: str) -> list:
    table = session.table
    if kind == "command":
        return sorted(c.name for c in table.commands)     # aliases work when typed, but are not offered
    if kind.startswith("sub:"):
        return kind[4:].split("|")
    if kind == "kind":
        return list(KIND_WORDS)
    if kind == "stat":
        return list(P.STATS) + (list(P.OPS) if words and words[0] == "watch" else [])
    if kind == "op":
        return list(P.OPS) + ["consecutive", "always", "fail"]
    if kind == "point":
        return [str(n) for n in sorted(session.points)]
    if kind == "info":
        return list(INFO)
    if kind == "rule":
        return [r.id for r in session.rules.rules] if session.rules is not None else []
    if kind == "module":
        return sorted(session.view.known_names("module"))
    if kind == "tensor":
        k = _kind_of(words)
        if k:
            return sorted(session.view.known_names(k) | {n for n, kk in session.view.series_names() if kk == k})
        return sorted({n for n, _ in session.view.series_names()} | session.view.known_names("act")
                      | session.view.known_names("param"))
    if kind == "hyper":
        keys = set()
        for _, opt in session.view.optimizers():
            for g in opt.param_groups:
                keys |= {k for k in g if k != "params"}
        return sorted(keys)
    if kind == "expr":
        names = ["$" + v for v in session.view.variables()]
        f = session.frame
        if f is not None:
            names += list(f.f_locals) + [k for k in f.f_globals if not k.startswith("__")]
        return names
    return []


class NndbCompleter(Completer):
    def __init__(self, get_session):
        self.get_session = get_session
        self._paths = PathCompleter(expanduser=True)

    def get_completions(self, document: Document, complete_event):
        session = self.get_session()
        if session is None:
            return
        text = document.text_before_cursor
        try:
            kind, words, current = suggest(session.table, text)
        except Exception:
            return
        if kind is None:
            return
        if kind == "file":
            yield from self._paths.get_completions(Document(current, len(current)), complete_event)
            return
        if kind == "expr":
            # complete the last identifier of the expression
            head = current
            for sep in " ()[],+-*/=<>!&|:":
                head = head.rsplit(sep, 1)[-1]
            current = head
        try:
            names = candidates(session, kind, words, current)
        except Exception:
            return
        glob = any(c in current for c in "*?[")
        seen = set()
        for name in names:
            ok = fnmatch.fnmatchcase(name, current) if glob else name.startswith(current)
            if ok and name not in seen:
                seen.add(name)
                yield Completion(name, start_position=-len(current))
