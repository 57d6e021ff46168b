"""The debugger's commands: one table built from the command families."""
from __future__ import annotations

from . import breakpoints, change, control, inspect
from .table import Command, CommandTable, Table

TABLE = CommandTable(control.COMMANDS + breakpoints.COMMANDS + inspect.COMMANDS + change.COMMANDS)

__all__ = ["TABLE", "Command", "CommandTable", "Table"]
