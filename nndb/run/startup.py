"""The modules Python had loaded before nndb: its start-up, and whatever
imported nndb.  ``nndb/__init__`` imports this module first, so the set is
taken before nndb imports anything of its own.  A script's own module file
beside it cannot shadow these under plain python either
(``nndb.run.launcher.unshadow``)."""
import sys

MODULES = frozenset(sys.modules)
