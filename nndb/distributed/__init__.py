"""nndb under torch.distributed: one trace per rank in one run directory
(``job``), the worker's link to the front process (``worker``), the front
that starts the job through torch's own launcher (``front``), and the
Python stacks of the ranks (``stacks``)."""
