"""A testbed node's mlx-medic installed as production installs it: from a wheel.

Why: the fleet benchmarks time node helpers, and a production node runs a wheel
install (`pip install mlx-medic`). The dev venv (.venv) holds an editable install instead,
whose `__editable__` .pth import hook runs at every interpreter start (17 ms of CPU on a
bare `python -c pass` here, most of it importing pathlib, re and enum, which the CLI
imports anyway): a dev-only cost the benches should not carry.

`install_node_medic(workdir)` builds a wheel of this checkout's tracked files (as the
working tree has them; untracked files are left out), installs it without dependencies
into a plain venv under `workdir`, and points that venv at the running interpreter's
site-packages for the third-party dependencies by one plain path line in a .pth file
(added to sys.path as is: the .pth hooks in that directory do not run). `workdir` must
be visible inside the nodes (under /var/tmp: every node has a private /tmp).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from scripts.wheel_proof import ProofFailed, build_wheel, export_tracked_files

REPO = Path(__file__).resolve().parents[1]


class NodeInstallFailed(RuntimeError):
    """A step of the install failed; the message names it and carries pip's output."""


def _step(name: str, argv: list[str | Path]) -> None:
    """Run one step; on failure, raise with the step's name, command and output."""
    # Without PYTHONPATH: a checkout on it (the benches run with PYTHONPATH=<checkout>)
    # shows pip that checkout's egg-info as mlx-medic installed already, and pip skips it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, check=False, env=env
    )
    if result.returncode != 0:
        raise NodeInstallFailed(
            f"{name}: {' '.join(map(str, argv))} exited {result.returncode}\n"
            f"{result.stdout}{result.stderr}"
        )


def install_node_medic(workdir: Path, repo: Path = REPO) -> Path:
    """Install this checkout under `workdir` (new); the installed `mlx-medic` script."""
    workdir.mkdir(parents=True)
    try:
        source = export_tracked_files(repo, workdir / "source")
        wheel = build_wheel(source, workdir / "dist")
    except ProofFailed as exc:
        raise NodeInstallFailed(f"build the wheel: {exc}") from exc
    venv = workdir / "venv"
    # The base interpreter, not the dev venv's: a plain venv, without its .pth hooks.
    base = getattr(sys, "_base_executable", sys.executable)
    _step("create the venv", [base, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    flags = ["--no-deps", "--no-index", "--root-user-action=ignore"]
    _step("install the wheel", [*pip, *flags, wheel])
    # The dependencies: the dev venv's site-packages as a plain sys.path entry.
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv}))
    (site_packages / "mlx_medic_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    script = venv / "bin" / "mlx-medic"
    if not script.is_file():
        raise NodeInstallFailed(f"install the wheel: no console script at {script}")
    return script
