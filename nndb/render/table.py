"""The one tabular shape commands return; renderers turn it into text."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    headers: tuple
    rows: list
    title: str = ""
    empty: str = ""          # printed instead of an empty table


class PictureFile(str):
    """A picture a command wrote: its text is the line the terminal shows
    ("wrote PATH"), ``path`` the file (a notebook shows the picture inline)."""

    def __new__(cls, path: str):
        self = super().__new__(cls, f"wrote {path}")
        self.path = path
        return self
