"""The one tabular shape commands return; renderers turn it into text."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    headers: tuple
    rows: list
    title: str = ""
    empty: str = ""          # printed instead of an empty table
