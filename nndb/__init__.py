"""nndb: a gdb/pdb-style debugger for PyTorch training."""
__version__ = "0.1.0"
