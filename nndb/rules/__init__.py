"""Diagnostic rules: base classes, built-in rules, probes, the engine and the
YAML rule file.  UI-free: findings are data; the debugger prints them."""
