"""The mlx.launch command lines the wrapper runs: the smoke test and the model's ranks.

Both go through the rank guard twice: around mlx.launch on the head (left without its
wrapper, mlx.launch is ended like a rank) and around every rank. Both carry the run id
(`--env`), the model's own `--starting-port` and the ranks' interpreter (`--python`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from mlx_medic.inventory.model import Backend, Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.serve.guard import guard_argv
from mlx_medic.serve.nodes import StartRefused
from mlx_medic.state.runs import run_env


def rank_python(model: Model) -> str:
    return str(model.serve.python) if model.serve.python is not None else sys.executable


def mlx_launch_program(model: Model) -> str:
    """mlx.launch beside the ranks' interpreter, else beside this one, else on PATH."""
    for python in (rank_python(model), sys.executable):
        beside = Path(python).parent / "mlx.launch"
        if beside.exists():
            return str(beside)
    found = shutil.which("mlx.launch")
    if found is None:
        raise StartRefused(f"mlx.launch is neither beside {rank_python(model)} nor on PATH")
    return found


def server_command(model: Model, backend: Backend) -> list[str]:
    """mlx_lm.server's arguments after the interpreter."""
    return [
        "-m",
        "mlx_lm",
        "server",
        "--model",
        model.model,
        "--host",
        model.host,
        "--port",
        str(model.port),
        *(["--pipeline"] if backend.pipeline else []),
        *model.serve_flags(),
    ]


def serve_args_warnings(model: Model) -> list[str]:
    """What the inventory's serve arguments leave to chance."""
    if "prefill-step-size" in model.serve_args:
        return []
    return [
        f"model {model.name} has no prefill-step-size in serve_args: mlx_lm.server then"
        " prefills with its own default step, whatever the model's memory allows"
    ]


def smoke_command(model: Model, backend_name: str, inventory: Inventory) -> list[str]:
    return [
        "-m",
        "mlx_medic.serve.smoke",
        "--backend",
        backend_name,
        "--state-dir",
        str(inventory.state_dir),
        "--model",
        model.name,
    ]


def launch_argv(
    inventory: Inventory,
    model: Model,
    backend_name: str,
    backend: Backend,
    run_id: str,
    rank_command: list[str],
    python_args: bool = True,
) -> list[str]:
    """What the wrapper runs on the head: guard, mlx.launch, guard, the rank command
    (the ranks' interpreter's arguments; with `python_args` false, an argv of its own)."""
    policy = model.policy
    guard = {
        "model": model.name,
        "run_id": run_id,
        "state_dir": inventory.state_dir,
        "grace": policy.kill_grace,
        "sigkill": policy.sigkill,
        "backend": backend_name,
    }
    env = [
        word
        for key, value in run_env(model.name, run_id).items()
        for word in ("--env", f"{key}={value}")
    ]
    ports = (
        []
        if model.serve.starting_port is None
        else ["--starting-port", str(model.serve.starting_port)]
    )
    smoke = rank_command[:2] == ["-m", "mlx_medic.serve.smoke"]
    return [
        # mlx.launch is no rank: its SIGKILL spends no protection domain
        *guard_argv(sys.executable, python_args=False, **{**guard, "backend": "none"}),  # type: ignore[arg-type]
        mlx_launch_program(model),
        "--hostfile",
        str(backend.hostfile),
        "--backend",
        backend_name,
        "--python",
        rank_python(model),
        *env,
        *ports,
        "--",
        *guard_argv("", python_args=python_args, smoke=smoke, **guard),  # type: ignore[arg-type]
        *rank_command,
    ]
