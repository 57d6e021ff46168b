"""Time travel: checkpoints, replicas, reverse execution and predict."""
