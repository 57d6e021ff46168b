"""One operation of a step's lineage: a list of FIELDS, in this order, as
the op recorder appends it and the trace stores it (JSON lists).  Plain
data, no torch: read them by the index names below, never by number."""
from __future__ import annotations

FIELDS = ("op", "phase", "inputs", "outputs", "shapes", "dtypes", "module", "file", "line", "node")
# (the unpacking fails at import if FIELDS gains or loses a field and these are not updated)
OP, PHASE, INS, OUTS, SHAPES, DTYPES, MODULE, FILE, LINE, NODE = range(len(FIELDS))

# An op's output statistics (lineage on --stats): a list of these, by op index.
OP_STATS = ("min", "max", "mean", "nan", "inf")


def op_name(op) -> str:
    """The ATen operation's name without its overload ('addmm', not 'addmm.default')."""
    return op[OP].split(".")[0]
