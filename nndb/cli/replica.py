"""The entry point of a respawned replica (nndb.timetravel.respawn): a
fresh ``python`` that replays the run from its start, given its session's
options and front end over the respawn channel, not by a command line."""
from __future__ import annotations

import os
import sys

from .common import session_frontend


def replica_main() -> None:
    """The entry point of a respawned replica (nndb.timetravel.respawn)."""
    from ..driver import DebugOptions, build_session
    from ..timetravel import respawn
    chan, msg = respawn.connect()
    if msg is None:
        os._exit(3)
    fe = session_frontend(interactive=bool(msg.get("interactive")) and sys.stdin.isatty(),
                          scripted=bool(msg.get("scripted")))
    respawn.run(build_session(fe, DebugOptions(**respawn.session_options(msg))), chan, msg)
