"""Processes on a node: what an MLX process is, which model it serves, and what the
node's rules say about it (orphans, survivors, liveness).

    info          one process as a table snapshot sees it; the table protocol (the leaf)
    command_line  what a command line runs, an ssh client's launch script
    roles         a process's role (launcher, ssh client, rank, share rank, exo runner)
    scope         which model a process belongs to
    placement     a launch's placement, from what mlx.launch hands its ranks
    orphans       the orphan rules over one snapshot; orphan_scan runs them on a node
    survivors     what a sweep could not end, and what a start does about it
    pid_liveness  is a pid, started at a time, still alive here
    not_ours      another user's process or file: reported, never touched

Imports nothing; the platform tables (`mlx_medic.platform`) build on `info`.
"""
