"""The command table: one declarative entry per command.

Each ``Command`` carries its name, aliases, usage line, help text, argument
parser (text -> value, raising CommandError), the function that runs it
(session, value -> data or None) and, for completion, the kind of thing each
argument position takes.  ``help``, completion, docs/commands.md's command list and
error messages all come from here.

Commands return data: a string, a list of lines, or a ``Table``;
``nndb.render.debug`` turns it into text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import CommandError
from ..render.table import PictureFile, Table  # noqa: F401  (commands return them)
from .rankspec import OnRanks, on_this_process, split_ranks, split_suffix


def no_args(text: str):
    if text.strip():
        raise CommandError(f"unexpected '{text.strip()}'")
    return None


def raw(text: str):
    return text.strip()


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    help: str
    run: Callable[[Any, Any], Any]
    parse: Callable[[str], Any] = raw
    aliases: tuple = ()
    # completion: what each argument position takes.  "sub:a|b|c" (fixed words),
    # "module", "tensor", "kind", "stat", "op", "point", "command", "hyper",
    # "expr", "file", "info" (the info sub-commands)
    args: tuple = ()
    group: str = "other"
    # across ranks (nndb.commands.ranks): "option" takes --ranks all|LIST (side by side),
    # "suffix" a trailing "rank N" (set on rank N only; else on every rank)
    ranks: str = ""

    @property
    def summary(self) -> str:
        return self.help.strip().splitlines()[0]


@dataclass
class CommandTable:
    commands: list = field(default_factory=list)

    def __post_init__(self):
        self._index()

    def _index(self) -> None:
        self.by_name = {}
        for c in self.commands:
            for n in (c.name, *c.aliases):
                if n in self.by_name:
                    raise ValueError(f"command name {n!r} defined twice")
                self.by_name[n] = c

    def names(self) -> list:
        return sorted(self.by_name)

    def lookup(self, word: str) -> Command:
        """Exact name or alias, else a unique prefix of a command name (gdb)."""
        c = self.by_name.get(word)
        if c is not None:
            return c
        hits = sorted({c.name for c in self.commands if c.name.startswith(word)})
        if len(hits) == 1:
            return self.by_name[hits[0]]
        if hits:
            # (as gdb: "com" stays ambiguous; each candidate is named with the
            # shortest prefix that picks it: commands (comm), compare (comp))
            raise CommandError(f'ambiguous command "{word}": '
                               + ", ".join(f"{h} ({self.shortest_prefix(h)})" for h in hits))
        raise CommandError(f'undefined command: "{word}".  Try "help".')

    def shortest_prefix(self, name: str) -> str:
        """The shortest word that ``lookup`` resolves to command ``name``: an
        alias, or the shortest unique prefix of its name."""
        best = name
        for n in range(1, len(name) + 1):
            p = name[:n]
            exact = self.by_name.get(p)
            if (exact is not None and exact.name == name) or \
                    (exact is None and [c.name for c in self.commands if c.name.startswith(p)] == [name]):
                best = p
                break
        return min((*self.by_name[name].aliases, best), key=len) if name in self.by_name else best

    @staticmethod
    def split(text: str) -> tuple[str, str]:
        """'p/full x' -> ('p/full', 'x'); '!x = 1' -> ('!', 'x = 1')."""
        s = text.strip()
        if s.startswith("!"):
            return "!", s[1:]
        parts = s.split(None, 1)
        word = parts[0]
        rest = parts[1] if len(parts) > 1 else ""
        return word, rest

    def parse(self, text: str):
        """A command line -> (its command, its parsed arguments), or None for
        a blank line or a comment; raises CommandError.  Needs no session:
        a batch run checks its startup commands with it before the script runs."""
        s = text.strip()
        if not s or s.startswith("#"):
            return None
        word, rest = self.split(s)
        base, slash, fmt = word.partition("/")
        cmd = self.lookup(base)
        if slash:
            rest = f"/{fmt} {rest}"
        try:
            if cmd.ranks:
                spec, rest = (split_ranks if cmd.ranks == "option" else split_suffix)(rest)
                if spec is not None:
                    return cmd, OnRanks(spec, cmd.parse(rest))
            return cmd, cmd.parse(rest)
        except CommandError as e:
            if not e.usage:
                e.usage = cmd.usage
            raise

    def dispatch(self, session, text: str):
        parsed = self.parse(text)
        if parsed is None:
            return None
        cmd, value = parsed
        if cmd.ranks:
            if isinstance(value, OnRanks):
                # (across ranks at the job's prompt: its console, before this session)
                if not on_this_process(value.spec, batch=session is not None and not session.interactive):
                    if cmd.name == "commands":
                        session.read_block()    # (its block is the other ranks' too: not run here)
                    return None
                value = value.value
        return cmd.run(session, value)

    def help(self, word: Optional[str] = None):
        if word:
            c = self.lookup(word)
            lines = [f"usage: {c.usage}"]
            if c.aliases:
                lines.append("aliases: " + ", ".join(c.aliases))
            lines.append("")
            lines.extend(c.help.strip().splitlines())
            return lines
        groups: dict = {}
        for c in self.commands:
            groups.setdefault(c.group, []).append(c)
        rows = []
        for g, cmds in groups.items():
            for c in cmds:
                names = c.name + (f" ({', '.join(c.aliases)})" if c.aliases else "")
                rows.append((g, names, c.summary))
        return Table(("group", "command", "what it does"), rows,
                     title='Commands ("help CMD" for one; a unique prefix of a name works):')
