"""What a loop or the demo may leave behind: nothing. Processes are found by the path of
the files they were started with (a token no process outside the test carries)."""

from __future__ import annotations

from pathlib import Path


def processes_naming(path: Path | str) -> list[int]:
    """Pids whose command line or working directory is under `path`."""
    text = str(path)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            cwd = str((proc / "cwd").readlink())
        except OSError:
            continue
        if text in cmdline or cwd.startswith(text):
            found.append(int(proc.name))
    return found
