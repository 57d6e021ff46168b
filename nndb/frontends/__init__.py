"""The front ends over the debugger session: the prompt_toolkit REPL
(``repl``, ``completer``, ``toolbar``: the only modules that import
prompt_toolkit), batch mode and a scripted one (``batch``), and the notebook
(``notebook``: the prompt is the notebook's input box)."""
