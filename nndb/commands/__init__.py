"""The debugger's commands: one table built from the command families."""
from __future__ import annotations

from . import breakpoints, change, control, fuzz, gradcheck, history, inspect, lineage, pictures, ranks, rules, timetravel
from .table import Command, CommandTable, Table

TABLE = CommandTable(control.COMMANDS + breakpoints.COMMANDS + inspect.COMMANDS + pictures.COMMANDS + history.COMMANDS
                     + gradcheck.COMMANDS
                     + rules.COMMANDS + change.COMMANDS + timetravel.COMMANDS + fuzz.COMMANDS
                     + lineage.COMMANDS + ranks.COMMANDS)

__all__ = ["TABLE", "Command", "CommandTable", "Table"]
