"""Per-node Prometheus exporter: read-only views of MLX rank hygiene.

The exporter uses client_python's metric families, registry and OpenMetrics encoder, none
of which needs the rest of the package; `prometheus_client/__init__.py` imports all of it
(its push gateway and HTTP servers bring `ssl`, `urllib.request`, `http.server`: about
10 MiB of resident memory, bench/busy_node). So, unless something in this process imported
it already, the package is registered here without running its `__init__`: its
submodules import as usual, and the first lookup of a name the package itself defines
(`from prometheus_client import Gauge`) runs the real `__init__` in place, so any other
user of prometheus_client in this process sees the whole package, same classes.
"""

from __future__ import annotations

import importlib.util
import sys
import threading


def _defer_prometheus_client_init() -> None:
    if "prometheus_client" in sys.modules:
        return
    spec = importlib.util.find_spec("prometheus_client")
    if spec is None or spec.loader is None:
        return  # not installed: the import that needs it says so
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    once = threading.Lock()

    def complete(name: str) -> object:
        """The real `__init__`, run once, on the first name the placeholder lacks."""
        with once:
            if package.__dict__.pop("__getattr__", None) is not None:
                loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules["prometheus_client"] = package


_defer_prometheus_client_init()
