"""Pipeline specs, their graphs, built-in steps and the executor."""
