"""`mlx-medic doctor`: checks, on one node, every assumption the project makes about the
machine (tool output formats, the service user's temp dir, the sudo rule, the forced
command, the interpreter, what the exporter can see) with the parsers the product uses,
and prints a report to paste into an issue. Read-only: every command it may run is in
`framework.READ_ONLY_COMMANDS`."""
