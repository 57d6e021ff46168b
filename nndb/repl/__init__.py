"""The prompt_toolkit REPL: the only package that imports prompt_toolkit."""
from .app import ReplFrontend

__all__ = ["ReplFrontend"]
