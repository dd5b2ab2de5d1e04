"""What the inventory's records answer beyond their fields, written once.

Two kinds of object carry the inventory: the validated pydantic models
(`mlx_medic.inventory`) and the plain records a node helper reads from a snapshot
(`mlx_medic.inventory.snapshot`, which loads no pydantic). Both take these methods from
here, so a helper and the remediator can never read the same file differently. Nothing
here imports pydantic or PyYAML.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeVar

from mlx_medic.file_problems import FileProblems

if TYPE_CHECKING:
    from mlx_medic.inventory.model_settings import ServeSettings

BackendName = Literal["jaccl", "ring"]

MEMORY_MARGIN = 1.2  # a rank's share of the weights, plus 20% for its KV cache and buffers


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Placed(_Named, Protocol):
    @property
    def nodes(self) -> list[str]: ...


# The record types each kind of object holds (mlx_medic.inventory's Node, Model, Backend
# for the validated models): generic, so this module needs nothing from that one.
NodeT = TypeVar("NodeT", bound=_Named)
ModelT = TypeVar("ModelT", bound=_Placed)
BackendT = TypeVar("BackendT")


class InventoryError(FileProblems):
    """The inventory cannot be used; `problems` lists each one with its place
    (`unreadable`: the file could not be read at all)."""


class ServiceMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        manager: str
        label: str
        plist: Path | None
        config: Path | None
        sudo: bool

    @property
    def plist_path(self) -> Path:
        return self.plist or Path("/Library/LaunchDaemons") / f"{self.label}.plist"

    @property
    def socket_config(self) -> Path | None:
        """supervisord's config, where the head may ask supervisord over the socket it names
        instead of running supervisorctl: no sudo (a root-only socket is supervisorctl's,
        through the sudoers rule) and a config named (supervisorctl finds its own default)."""
        if self.manager != "supervisord" or self.sudo:
            return None
        return self.config


class BackendsMethods(Generic[BackendT]):
    __slots__ = ()
    if TYPE_CHECKING:
        jaccl: BackendT | None
        ring: BackendT | None

    def in_order(self) -> list[tuple[BackendName, BackendT]]:
        found: list[tuple[BackendName, BackendT]] = []
        if self.jaccl is not None:
            found.append(("jaccl", self.jaccl))
        if self.ring is not None:
            found.append(("ring", self.ring))
        return found


class ProcessPatternsMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        rank: list[str]
        share: list[str]

    def compiled(self) -> list[tuple[str, re.Pattern[str]]]:
        """(role, regex) in the order they are tried."""
        return [("rank", re.compile(p)) for p in self.rank] + [
            ("share", re.compile(p)) for p in self.share
        ]


class ModelMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        model: str
        nodes: list[str]
        serve: ServeSettings
        serve_args: dict[str, str | int | float | bool]
        tmp_dirs: list[Path]
        cache_dirs: list[Path]

    @property
    def head(self) -> str:
        return self.nodes[0]

    def serve_flags(self) -> list[str]:
        """`serve_args` as command-line flags, in file order."""
        flags: list[str] = []
        for flag, value in self.serve_args.items():
            if value is True:
                flags.append(f"--{flag}")
            elif value is not False:
                flags += [f"--{flag}", str(value)]
        return flags

    def scope_dirs(self) -> list[Path]:
        return [*self.tmp_dirs, *self.cache_dirs]

    def weights_path(self) -> Path | None:
        """The weights' dir on every node: `serve.preseed.path`, else a local `model`."""
        if self.serve.preseed.path is not None:
            return self.serve.preseed.path
        local = Path(self.model)
        return local if local.is_absolute() else None


class InventoryMethods(Generic[NodeT, ModelT]):
    __slots__ = ()
    if TYPE_CHECKING:
        nodes: list[NodeT]
        models: list[ModelT]

    def node(self, name: str) -> NodeT:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def model(self, name: str) -> ModelT:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    def models_on(self, node: str) -> list[ModelT]:
        return [m for m in self.models if node in m.nodes]
