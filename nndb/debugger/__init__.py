"""The debugger: a UI-free session (run control, stops, breakpoints), its
command table, command files and the report.  The REPL (nndb.frontends.repl) and batch
mode are front ends over the same session."""
