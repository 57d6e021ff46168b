"""nndb's version (a leaf module: the metadata of every trace records it)."""
__version__ = "0.1.0"
