"""`mlx-medic serve MODEL`: what a model's service runs on its head node.

One module per job: `record` (the head's serve record), `start` (lock, records, sweep,
clean), `backend` (choice, ledger, smoke test), `launch` (mlx.launch argv), `supervise`
(running and watching mlx.launch), `teardown` (ending every rank of the run), `guard`
(beside each rank: ends it when the run's lease runs out), `smoke` (the smoke test's
rank program and its verdict), `nodes` (the helpers on every node at once, and the run's
lease), `run` (one start and its supervision, strung together from the above), `cli` (the
command).
"""
