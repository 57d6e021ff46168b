"""Exports of a run to where users already look: TensorBoard and MLflow.

``scalars`` turns a trace (or one live step's record) into plain data:
tagged scalar series, the findings as text, the run's parameters.  The
sinks (``tensorboard``, ``mlflow``) write that data with the real writers,
imported only when a sink is opened (optional extras, nndb.extras).
``offline`` drives a sink over a finished trace (``nndb export``); ``live``
streams each step's record from a background thread (``nndb run --export``).
"""
