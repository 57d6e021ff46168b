"""Tensor lineage: the operations of a step, which tensor each produced from
which, in which module and on which line of the script (``ops``), how it is
stored (``store``), and the questions asked of it (``graph``, ``origin``)."""
