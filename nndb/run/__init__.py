"""Running a script as nndb does: exactly as ``python SCRIPT`` would
(``launcher``, ``safepath``, ``startup``, ``preload``), recorded (``runner``,
with its ``config``, ``meta`` and ``rank``), and the files nndb writes
(``paths``)."""
