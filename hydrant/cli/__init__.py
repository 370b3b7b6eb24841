"""The `hydrant` command line: one group, a module per command family."""
