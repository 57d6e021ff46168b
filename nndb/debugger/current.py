"""The debugger session of this process's live run, if any: what
``nndb.set_trace()`` stops in when the process runs under ``nndb run`` (or
inside ``nndb.record``, or an earlier ``set_trace``).  A weak reference: the
registry never keeps a session alive."""
from __future__ import annotations

import weakref
from typing import Optional

_live: Optional[weakref.ref] = None


def attached(session) -> None:
    global _live
    _live = weakref.ref(session)


def ended(session) -> None:
    global _live
    if _live is not None and _live() is session:
        _live = None


def session():
    """The session whose run is live in this process, or None."""
    s = _live() if _live is not None else None
    return s if s is not None and s.live else None
