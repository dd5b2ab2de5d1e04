"""The sweep: end a model's processes on this node, whatever their parent, safely.

Scope for acting is stricter than the exporter's scoping. A process is a target only if
- it is one of the model's processes by what it runs: a role from its command line
  (mlx.launch, its ssh clients, mlx_lm), from the model's process patterns, or MLX_RANK
  in its environment, and the exporter's scoping puts it in this model; AND
- it carries one of the model's keys: its model path (`--model`), its port (`--port`),
  an argument under its tmp dirs, its MLX_MEDIC_MODEL tag, or a run id of the model
  (the current one here, or the one `--run` names).
So a `cp` or a `tail -f` that merely names the model's dirs never is (no role), and
never the sweep itself, its ancestors, or any `mlx-medic` command (the serve wrapper,
a helper started from a rank's environment).

Guards, in every mode: a process listening on another model's port is never touched. A
process listening on this model's port is ended only by the serve wrapper's start sweep
(`--start-sweep`, run under the model lock when no legitimate server can exist; it says
so loudly), by `--run RUN_ID` when the listener carries that run id (the wrapper ending
its own run), and by the default sweep when it does not answer the health probe (a hung
rank holding the port); otherwise it is spared (an answering server always, but for
those first two).

Signals: SIGTERM to every target, up to `policy.kill_grace` for them to end, then
SIGKILL to the survivors if `policy.sigkill`, then a bounded wait. Before each signal
the process's identity (pid, start time, command line) is read again; a process whose
identity changed is skipped, so a reused pid is never hit. Each SIGKILL of a JACCL rank
is recorded in the protection-domain ledger (once per process). A survivor in
uninterruptible sleep is reported as unkillable: only a reboot frees it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_medic.orphan_scan import OrphanScan, ProcessReader, ScanResult, read_as_process
from mlx_medic.orphans import run_id_of
from mlx_medic.placement import rank_devices
from mlx_medic.platform.process_identity import Identity, own_lineage, read_identity
from mlx_medic.process_model import (
    ENV_IBV_DEVICES,
    ENV_JACCL_COORDINATOR,
    ENV_MODEL,
    ModelScoper,
    ProcessInfo,
    ProcessTable,
    State,
    flag_value,
    invocation,
    launch_script_env,
    scope_argv,
    under_any,
)

if TYPE_CHECKING:
    from mlx_medic.inventory import Inventory, Model

POLL = 0.02  # seconds between looks while waiting for targets to end
KILL_WAIT = 3.0  # after SIGKILL: a process that is still there then will not go by itself
HEALTH_TIMEOUT = 3.0


class Mode(StrEnum):
    SCOPE = "scope"  # everything in scope
    ORPHANS_ONLY = "orphans-only"  # what the shared orphan rules call orphans
    RUN = "run"  # the processes of one run
    START_SWEEP = "start-sweep"  # the serve wrapper's own start sweep, under the model lock


# --- the scope rules ---------------------------------------------------------------------


def is_medic_command(cmdline: tuple[str, ...]) -> bool:
    """`mlx-medic ...` or `python -m mlx_medic...`: the wrapper, a helper, the exporter."""
    inv = invocation(cmdline)
    if inv is None:
        return False
    if inv.kind == "module":
        return inv.target == "mlx_medic" or inv.target.startswith("mlx_medic.")
    return inv.kind in ("script", "program") and inv.target == "mlx-medic"


def model_tag(proc: ProcessInfo) -> str | None:
    return proc.env.get(ENV_MODEL) or launch_script_env(proc.cmdline).get(ENV_MODEL) or None


def carries_key(proc: ProcessInfo, model: Model, run_ids: set[str]) -> bool:
    """One of the model's keys: its `--model`, `--port`, a path under its tmp dirs, its
    model tag, or one of `run_ids` (the model's runs)."""
    argv = scope_argv(proc.cmdline)
    if flag_value(argv, "--model") == model.model:
        return True
    if flag_value(argv, "--port") == str(model.port):
        return True
    if model.tmp_dirs and any(under_any(arg, model.tmp_dirs) for arg in argv):
        return True
    if model_tag(proc) == model.name:
        return True
    run_id = run_id_of(proc)
    return run_id is not None and run_id in run_ids


def in_sweep_scope(
    proc: ProcessInfo, model: Model, scoper: ModelScoper, run_ids: set[str]
) -> bool:
    """The model's pattern (a role, and the exporter's scoping says this model) and one of
    its keys, or a role and one of the model's run ids; never an `mlx-medic` command."""
    if proc.role is None or is_medic_command(proc.cmdline):
        return False
    found = scoper.model_of(proc)
    if found is None and run_id_of(proc) in run_ids:
        return True  # placed by nothing else, but tagged with one of the model's runs
    return found == model.name and carries_key(proc, model, run_ids)


def is_jaccl_rank(proc: ProcessInfo) -> bool:
    return ENV_IBV_DEVICES in proc.env or ENV_JACCL_COORDINATOR in proc.env


# --- the report ----------------------------------------------------------------------------


@dataclass
class Target:
    proc: ProcessInfo
    rule: str | None = None
    signals: list[str] = field(default_factory=list)
    state: State | None = None  # last seen, for survivors

    @property
    def role(self) -> str:
        return str(self.proc.role)

    def same(self, identity: Identity | None) -> bool:
        return identity is not None and identity.same_process(
            self.proc.pid, self.proc.create_time, self.proc.cmdline)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.proc.pid, "start_time": self.proc.create_time,
                "cmdline": list(self.proc.cmdline), "role": self.role, "rule": self.rule,
                "signals": list(self.signals)}  # fmt: skip

    def survivor_json(self) -> dict[str, Any]:
        return {"pid": self.proc.pid, "start_time": self.proc.create_time,
                "cmdline": list(self.proc.cmdline), "role": self.role,
                "state": str(self.state or self.proc.state)}  # fmt: skip


@dataclass
class SweepReport:
    model: str
    node: str
    mode: Mode
    run_id: str | None
    dry_run: bool
    targets: list[Target] = field(default_factory=list)
    exited: list[int] = field(default_factory=list)
    survivors: list[Target] = field(default_factory=list)
    spared: list[dict[str, Any]] = field(default_factory=list)
    pd_spent: int = 0
    listeners_signalled: list[int] = field(default_factory=list)  # start sweep, or a silent one

    @property
    def unkillable(self) -> list[Target]:
        return [s for s in self.survivors if s.state is State.UNINTERRUPTIBLE]

    @property
    def complete(self) -> bool:
        return not self.survivors

    def spare(self, proc: ProcessInfo, reason: str) -> None:
        self.spared.append({"pid": proc.pid, "cmdline": list(proc.cmdline), "reason": reason})

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "node": self.node, "mode": str(self.mode),
            "run_id": self.run_id, "dry_run": self.dry_run,
            "signalled": [t.to_json() for t in self.targets if t.signals or self.dry_run],
            "exited": self.exited,
            "survivors": [s.survivor_json() for s in self.survivors],
            "unkillable": [s.survivor_json() for s in self.unkillable],
            "spared": self.spared, "pd_spent": self.pd_spent, "complete": self.complete,
            "listeners_signalled": self.listeners_signalled,
        }  # fmt: skip


# --- the sweep -------------------------------------------------------------------------------


def answers_health_probe(model: Model, state_dir: Path) -> tuple[bool, str]:
    """Whether the model's port answers the health probe (a real one-token completion),
    never overlapping the exporter's probe of it (the same lock files: two requests at
    once can crash JACCL ranks, mlx-lm#1737)."""
    from mlx_medic.health import probe_host, probe_model

    result = probe_model(probe_host(model.host), model.port, timeout=HEALTH_TIMEOUT,
                         lock_dir=_probe_lock_dir(state_dir))  # fmt: skip
    return result.up, result.reason


def _probe_lock_dir(state_dir: Path) -> Path | None:
    """`<state_dir>/locks`, as the exporter's probe uses; None (this process only) if it
    cannot be made."""
    path = state_dir / "locks"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return path


Spender = Callable[..., bool]


def _ledger_spender(state_dir: Path, node: str) -> Spender:
    def spend(**kwargs: Any) -> bool:
        from mlx_medic.node.ledger import record_spend

        return record_spend(state_dir, node, "sigkill", **kwargs)

    return spend


@dataclass
class Seams:
    """What a test may replace: how processes are read and signalled, and time."""

    identity: Callable[[int], Identity | None] = read_identity
    kill: Callable[[int, int], None] = os.kill
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    health: Callable[[Model, Path], tuple[bool, str]] = answers_health_probe
    read_file: ProcessReader = read_as_process
    lineage: Callable[[], set[int]] = own_lineage
    # called after the listing, before each signal: a test can end the process and give
    # its pid to another here
    before_signal: Callable[[ProcessInfo, str], None] | None = None
    warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)


class Sweep:
    """One sweep of one model on this node: `plan` (scope, mode, guards), then `run`
    (signals, bounded waits, ledger spends); the report says what happened."""

    def __init__(
        self,
        *,
        inventory: Inventory,
        model: Model,
        node: str,
        state_dir: Path,
        table: ProcessTable,
        mode: Mode = Mode.SCOPE,
        run_id: str | None = None,
        dry_run: bool = False,
        seams: Seams | None = None,
        spend: Spender | None = None,
        scan: OrphanScan | None = None,
    ):
        self.inventory = inventory
        self.model = model
        self.node = node
        self.state_dir = Path(state_dir)
        self.table = table
        self.mode = mode
        self.run_id = run_id
        self.dry_run = dry_run
        self.seams = seams or Seams()
        self.spend = spend or _ledger_spender(self.state_dir, node)
        self.scan = scan or OrphanScan(node=node, inventory=inventory, state_dir=self.state_dir,
                                       read_file=self.seams.read_file)  # fmt: skip
        self.report = SweepReport(model.name, node, mode, run_id, dry_run)
        self._health: tuple[bool, str] | None = None  # asked once per sweep
        self._reused: set[int] = set()  # pids that were another process's at signal time

    # --- choosing ---------------------------------------------------------------------

    def _other_ports(self) -> list[tuple[str, int]]:
        return [(m.name, m.port) for m in self.inventory.models
                if m.name != self.model.name and m.port != self.model.port]  # fmt: skip

    def plan(self) -> list[Target]:
        """The targets of this mode; what is spared and why goes in the report."""
        result: ScanResult = self.scan.scan(self.table.snapshot())
        runs = result.current_runs  # what the scan read (None: no current run recorded)
        current = runs[self.model.name] if self.model.name in runs else self._current_run()
        run_ids = {r for r in (current, self.run_id) if r}
        lineage = self.seams.lineage()
        scoper = self.scan.scoper
        targets = []
        for proc in result.snapshot:
            if not in_sweep_scope(proc, self.model, scoper, run_ids):
                continue
            if proc.pid in lineage:
                self.report.spare(proc, "the sweep itself or one of its ancestors")
                continue
            if proc.state is State.ZOMBIE:
                continue  # already ended; its parent reaps it
            rule = self._mode_rule(proc, result, current)
            if rule is False:
                continue
            if self._guarded(proc, result):
                continue
            targets.append(Target(proc, rule if isinstance(rule, str) else None))
        return targets

    def _current_run(self) -> str | None:
        from mlx_medic.runs import read_current_run

        return read_current_run(self.state_dir, self.model.name)

    def _mode_rule(self, proc: ProcessInfo, result: ScanResult,
                   current: str | None) -> str | bool | None:  # fmt: skip
        """The orphan rule (orphans-only), None (a target with no rule), or False (not
        a target in this mode; spared with its reason where that helps)."""
        if self.mode is Mode.RUN:
            return None if run_id_of(proc) == self.run_id else False
        if self.mode is not Mode.ORPHANS_ONLY:
            return None
        suspect = result.report.suspect_rule_of(proc.pid)
        if suspect is not None:
            self.report.spare(proc, f"a suspect ({suspect}): suspects are never swept")
            return False
        if current is not None and run_id_of(proc) == current:
            self.report.spare(proc, f"of the model's current run {current}")
            return False
        rule = result.report.rule_of(proc.pid)
        if rule is None:
            self.report.spare(proc, "not an orphan")
            return False
        return str(rule)

    def _guarded(self, proc: ProcessInfo, result: ScanResult) -> bool:
        """True (and spared) for a listener this mode may not touch."""
        for name, port in self._other_ports():
            if result.probe(proc.pid, port) is True:
                self.report.spare(proc, f"listens on model {name}'s port {port}: never touched")
                return True
        if result.probe(proc.pid, self.model.port) is not True:
            return False
        if self._health is None:
            self._health = self.seams.health(self.model, self.state_dir)
        answers, why = self._health
        health = ("answers the health probe" if answers
                  else f"does not answer the health probe ({why})")  # fmt: skip
        if self.mode is Mode.START_SWEEP:
            self.seams.warn(
                f"mlx-medic node sweep --start-sweep: pid {proc.pid} listens on model"
                f" {self.model.name}'s port {self.model.port} and {health}; ending it: the"
                " serve wrapper holds the model lock, so no legitimate server can exist now"
            )
            self.report.listeners_signalled.append(proc.pid)
            return False
        if self.mode is Mode.RUN and run_id_of(proc) == self.run_id:
            return False  # the wrapper ending its own run
        if self.mode is Mode.SCOPE and not answers:
            # A hung rank holding the port (the service stopped, no answer): it would make
            # the next start fail with "Address already in use". Only an answering server
            # is the seed's guarded one.
            self.report.listeners_signalled.append(proc.pid)
            return False
        self.report.spare(
            proc, f"listens on the model's port {self.model.port} and {health}: only the"
            " serve wrapper's start sweep ends it")  # fmt: skip
        return True

    # --- signalling ---------------------------------------------------------------------

    def _signal(self, target: Target, signum: signal.Signals) -> bool:
        """Send `signum` if the process is still the one listed; False if it is not."""
        proc = target.proc
        if self.seams.before_signal is not None:
            self.seams.before_signal(proc, signum.name)
        if not target.same(self.seams.identity(proc.pid)):
            return False
        try:
            self.seams.kill(proc.pid, signum)
        except ProcessLookupError:
            return False
        target.signals.append(signum.name)
        return True

    def _alive(self, target: Target) -> bool:
        identity = self.seams.identity(target.proc.pid)
        if not target.same(identity) or identity is None or identity.state is State.ZOMBIE:
            return False
        target.state = identity.state
        return True

    def _wait(self, targets: list[Target], seconds: float) -> list[Target]:
        """The targets still alive after up to `seconds` (bounded; returns early)."""
        deadline = self.seams.clock() + seconds
        alive = [t for t in targets if self._alive(t)]
        while alive and self.seams.clock() < deadline:
            self.seams.sleep(POLL)
            alive = [t for t in alive if self._alive(t)]
        return alive

    def run(self) -> SweepReport:
        targets = self.plan()
        report = self.report
        report.targets = targets
        if self.dry_run:
            return report
        sent: list[Target] = []
        for target in targets:
            if self._signal(target, signal.SIGTERM):
                sent.append(target)
            else:
                self._changed(target)
        alive = self._wait(sent, self.model.policy.kill_grace)
        if alive and self.model.policy.sigkill:
            killed = []
            for target in alive:
                if self._signal(target, signal.SIGKILL):
                    killed.append(target)
                    self._record_spend(target)
                else:
                    self._changed(target)
            alive = self._wait(killed, min(KILL_WAIT, max(self.model.policy.kill_grace, 1.0)))
        report.survivors = alive
        survivors = {t.proc.pid for t in alive}
        report.exited = [t.proc.pid for t in targets
                         if t.proc.pid not in survivors and t.proc.pid not in self._reused]
        return report

    def _changed(self, target: Target) -> None:
        """Not signalled: gone already (it exited), or its pid is another process's now."""
        identity = self.seams.identity(target.proc.pid)
        if identity is not None and not target.same(identity):
            self._reused.add(target.proc.pid)
            self.report.spare(target.proc, "its pid now belongs to another process (pid"
                              " reused between listing and signalling): not signalled")

    def _record_spend(self, target: Target) -> None:
        proc = target.proc
        if not is_jaccl_rank(proc):
            return
        devices = rank_devices(proc.env, lambda path: self.seams.read_file(proc, path))
        if self.spend(pid=proc.pid, start_time=proc.create_time, devices=devices,
                      model=self.model.name):  # fmt: skip
            self.report.pd_spent += 1
