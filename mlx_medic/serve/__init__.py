"""`mlx-medic serve MODEL`: what a model's service runs on its head node.

One module per job: `record` (the head's serve record), `start` (lock, records, sweep,
clean), `backend` (choice, ledger, smoke test), `launch` (mlx.launch argv), `supervise`
(running and watching mlx.launch), `teardown` (ending every rank of the run), `guard`
(beside each rank: ends it when the run's lease runs out), `smoke` (the smoke test's
rank program), `cli` (the command, which strings them together).
"""
