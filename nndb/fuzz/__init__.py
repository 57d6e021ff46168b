"""Coverage-guided fuzzing of a model at a stop (TensorFuzz).

``mutate``: bounded mutations of a batch's input tensors; ``coverage``: the
nearest-neighbour coverage of activation vectors; ``search``: the fuzzing
loop (coverage-guided, or random search with the same mutations);
``tape``: the script's loss computation, recorded once and replayed on
mutants; ``objective``: what one mutant's evaluation finds; ``replica``:
where it all runs (a forked replica of the live run, never the run itself).
"""
