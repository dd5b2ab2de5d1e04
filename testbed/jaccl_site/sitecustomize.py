"""sitecustomize of the testbed's simulated JACCL backend (test-only; testbed/README.md).

Its directory is on PYTHONPATH only in processes the simulator's interpreter shim started
(`JacclSim.python`). In a JACCL rank (MLX_MEDIC_JACCL_SIM, MLX_IBV_DEVICES and
MLX_JACCL_COORDINATOR all set) it watches for the import of mlx.core and then loads
testbed/jaccl_rank.py by path, which patches `mlx.core.distributed.init`. A process that
never imports mlx (the product's rank guard) or has no JACCL environment (a ring rank)
costs nothing more than this file. Either way it then runs the sitecustomize it shadows,
if this Python has one.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at start-up: nothing of ours should be
if TYPE_CHECKING:
    from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_RUNTIME = "mlx_medic_testbed_jaccl_rank"
_CONFIG_ENV = "MLX_MEDIC_JACCL_SIM"


def _is_jaccl_rank() -> bool:
    env = os.environ
    return bool(
        env.get(_CONFIG_ENV) and env.get("MLX_IBV_DEVICES") and env.get("MLX_JACCL_COORDINATOR")
    )


def _runtime() -> Any:
    """testbed/jaccl_rank.py; a JACCL rank that cannot have it must not run unsimulated."""
    import importlib.util

    path = os.path.join(os.path.dirname(_HERE), "jaccl_rank.py")
    try:
        spec = importlib.util.spec_from_file_location(_RUNTIME, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[_RUNTIME] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    except Exception:
        import traceback

        traceback.print_exc()
        print(
            f"mlx-medic testbed: refusing to run a JACCL rank: {path} did not load",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)
    return module


class _PatchingLoader:
    """mlx.core's own loader, then the simulated JACCL's patch of the loaded module."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _runtime().install(module, os.environ[_CONFIG_ENV])


class _WatchForMlx:
    """A meta path finder that finds mlx.core as usual and hands it to _PatchingLoader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "mlx.core":
            return None
        import importlib.machinery

        sys.meta_path.remove(self)  # type: ignore[arg-type]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)  # type: ignore[assignment]
        return spec


def _chain() -> None:
    """Run the sitecustomize that this one shadows on sys.path (none in the project's venv)."""
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if _is_jaccl_rank():
    if "mlx.core" in sys.modules:  # only if a .pth file imported it already
        _runtime().install(sys.modules["mlx.core"], os.environ[_CONFIG_ENV])
    else:
        sys.meta_path.insert(0, _WatchForMlx())  # type: ignore[arg-type]
_chain()
