"""Pictures of a trace: ``data`` gathers the arrays a picture shows (plain
numpy, tested against the trace); ``nndb.render.plot`` draws them with
matplotlib (the ``plot`` extra)."""
