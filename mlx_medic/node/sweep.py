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
process listening on this model's port that answers the health probe is never touched
either (the seed's rule: an active server must not be disrupted); the start sweep then
reports it (`serving_listener`) and the serve wrapper does not start, since another
instance serves. A listener that does not answer is a hung rank holding the port only
after PROBES failed probes over PROBE_WINDOW seconds (one slow answer does not make a
loaded server hung): then the default sweep and the start sweep end it. `--run RUN_ID`
ends a listener of that run (the wrapper ending its own run).

Signals: SIGTERM to every target, up to the grace (`policy.kill_grace`, or `--grace`:
the serve wrapper's shorter grace for the ranks of a dead launch, docs/decisions.md) for
them to end, then SIGKILL to the survivors if `policy.sigkill`, then a bounded wait.
Before each signal the process's identity (pid, start time, command line) is read again;
a process whose identity changed is skipped, so a reused pid is never hit. Before SIGTERM
reaches a JACCL rank the ledger notes that a signal of ours ends it (`ended`), so its
rank guard does not count it as vanished; each SIGKILL of a JACCL rank is a ledger spend
(once per process).

Survivors: a survivor in uninterruptible sleep is unkillable: only a reboot frees it. It
is recorded in the ledger (`unkillable`, once per process, with its devices) and
reported with the domains it is believed to hold. When every survivor is unkillable and
none holds the model's port the sweep is `settled`: it did all a sweep can, and a start
may go on around them (mlx_medic.processes.survivors).

Not ours: the helper runs as the node's login user. A process in scope that it may not
signal (another user's: EPERM, checked with signal 0 before anything is noted or sent,
and again on each signal) is not the model's to end here: reported in `not_ours` with
its owner, never a target, a survivor or a failure (mlx_medic.processes.not_ours).

The scope rules are in `sweep_scope`, the report in `sweep_report`, the ledger notes in
`sweep_ledger`; this module keeps the plan and the signal sequence together (about 480
lines): both read every process through the same guards and identity checks.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_medic.node.sweep_ledger import LedgerNotes, Spender, _CallableNotes
from mlx_medic.node.sweep_report import SweepReport, Target
from mlx_medic.node.sweep_scope import Mode, backend_of, in_sweep_scope, is_jaccl_rank
from mlx_medic.platform.process_identity import Identity, own_lineage, read_identity
from mlx_medic.processes.info import ProcessInfo, ProcessTable, State
from mlx_medic.processes.not_ours import may_signal, process_uid
from mlx_medic.processes.orphan_scan import OrphanScan, ProcessReader, ScanResult, read_as_process
from mlx_medic.processes.orphans import run_id_of
from mlx_medic.processes.placement import rank_devices

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Inventory

POLL = 0.02  # seconds between looks while waiting for targets to end
KILL_WAIT = 3.0  # after SIGKILL: a process that is still there then will not go by itself
SIGKILL_WAIT = 0.5  # ... at least this long (a SIGKILLed process that can die dies in ms)
IDENTITY_TOLERANCE = 0.5  # seconds: two readings of one process's start time agree this well
HEALTH_TIMEOUT = 3.0
PROBES = 3  # failed health probes before a listener on the model's port counts as hung
PROBE_WINDOW = 10.0  # seconds they are spread over when one timed out (slow or hung)
BROKEN_WINDOW = 2.0  # ... when each was refused at once (an error, a closed connection)


# --- the sweep -------------------------------------------------------------------------------


Health = tuple[bool, str] | tuple[bool, str, bool]  # answers, why, and whether it timed out


def answers_health_probe(model: Model, state_dir: Path) -> Health:
    """Whether the model's port answers the health probe (a real one-token completion),
    never overlapping the exporter's probe of it (the same lock files: two requests at
    once can crash JACCL ranks, mlx-lm#1737), and whether a failure was a timeout."""
    from mlx_medic.health import probe_host, probe_model, shared_probe_lock_dir

    result = probe_model(
        probe_host(model.host),
        model.port,
        timeout=HEALTH_TIMEOUT,
        lock_dir=shared_probe_lock_dir(state_dir),
    )
    return result.up, result.reason, result.timed_out or not result.conclusive


@dataclass
class Seams:
    """What a test may replace: how processes are read and signalled, and time."""

    identity: Callable[[int], Identity | None] = read_identity
    kill: Callable[[int, int], None] = os.kill
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    health: Callable[[Model, Path], Health] = answers_health_probe
    read_file: ProcessReader = read_as_process
    lineage: Callable[[], set[int]] = own_lineage
    may_signal: Callable[[int], bool] = may_signal  # False: another user's (EPERM)
    owner: Callable[[int], int | None] = process_uid
    # called after the listing, before each signal: a test can end the process and give
    # its pid to another here
    before_signal: Callable[[ProcessInfo, str], None] | None = None
    warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)


class NodeSweep:
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
        spend: Spender | LedgerNotes | None = None,
        scan: OrphanScan | None = None,
        grace: float | None = None,
        crashed_run: str | None = None,
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
        self.ledger = (
            spend
            if isinstance(spend, LedgerNotes)
            else _CallableNotes(spend)
            if spend is not None
            else LedgerNotes(self.state_dir, node)
        )
        # SIGTERM to SIGKILL: the policy's, or a shorter one the caller chose
        self.grace = (
            model.policy.kill_grace if grace is None else min(grace, model.policy.kill_grace)
        )
        self.scan = scan or OrphanScan(
            node=node, inventory=inventory, state_dir=self.state_dir, read_file=self.seams.read_file
        )
        # the start sweep of a wrapper relaunching after its own run crashed: that run's
        # listener is the wrapper's own, ended even when it answers
        self.crashed_run = crashed_run if mode is Mode.START_SWEEP else None
        self.report = SweepReport(model.name, node, mode, run_id, dry_run)
        self._health: tuple[bool, str] | None = None  # judged once per sweep
        self._reused: set[int] = set()  # pids that were another process's at signal time
        self._survivors: set[tuple[int, float]] | None = None  # the ledger's, read once

    # --- choosing ---------------------------------------------------------------------

    def _other_ports(self) -> list[tuple[str, int]]:
        return [
            (m.name, m.port)
            for m in self.inventory.models
            if m.name != self.model.name and m.port != self.model.port
        ]

    def plan(self) -> list[Target]:
        """The targets of this mode; what is spared and why goes in the report."""
        result: ScanResult = self.scan.scan(self.table.snapshot())
        runs = result.current_runs  # what the scan read (None: no current run recorded)
        current = runs[self.model.name] if self.model.name in runs else self._current_run()
        run_ids = {r for r in (current, self.run_id, self.crashed_run) if r}
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
            holds_port = result.probe(proc.pid, self.model.port) is True
            if not self.seams.may_signal(proc.pid):  # after the guards: a serving one is spared
                self.report.foreign(
                    proc,
                    self.seams.owner(proc.pid),
                    holds_port,
                    "may not signal it (another user's process): left alone",
                )
                if proc.pid in self.report.listeners_signalled:  # a hung one: not by us
                    self.report.listeners_signalled.remove(proc.pid)
                continue
            target = Target(proc, rule if isinstance(rule, str) else None, holds_port=holds_port)
            if is_jaccl_rank(proc):
                target.devices = self._devices(proc)
            targets.append(target)
        return targets

    def _devices(self, proc: ProcessInfo) -> tuple[str, ...]:
        return rank_devices(proc.env, lambda path: self.seams.read_file(proc, path))

    def _current_run(self) -> str | None:
        from mlx_medic.state.runs import read_current_run

        return read_current_run(self.state_dir, self.model.name)

    def _mode_rule(
        self, proc: ProcessInfo, result: ScanResult, current: str | None
    ) -> str | bool | None:
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
        if self.mode is Mode.RUN and run_id_of(proc) == self.run_id:
            return False  # the wrapper ending its own run
        if self.crashed_run is not None and run_id_of(proc) == self.crashed_run:
            self.report.listeners_signalled.append(proc.pid)
            return False  # the wrapper's own crashed run, whatever it answers
        answers, why = self._judge_listener()
        port = self.model.port
        if answers:
            self.report.spare(
                proc,
                f"listens on the model's port {port} and answers the"
                " health probe: a serving process is never touched",
            )
            if self.mode is Mode.START_SWEEP:
                self.report.serving_listener = {"pid": proc.pid, "cmdline": list(proc.cmdline)}
                self.seams.warn(
                    f"mlx-medic node sweep --start-sweep: pid {proc.pid} listens on model"
                    f" {self.model.name}'s port {port} and answers the health probe: another"
                    " instance serves the model, so it is left alone and nothing may start"
                )
            return True
        if self.mode in (Mode.SCOPE, Mode.START_SWEEP):
            # A hung rank holding the port: it would make the next start fail with
            # "Address already in use".
            if self.mode is Mode.START_SWEEP:
                self.seams.warn(
                    f"mlx-medic node sweep --start-sweep: pid {proc.pid} listens on model"
                    f" {self.model.name}'s port {port} and does not answer ({why}); ending it"
                )
            self.report.listeners_signalled.append(proc.pid)
            return False
        self.report.spare(
            proc,
            f"listens on the model's port {port} and does not answer"
            f" the health probe ({why}); only the default sweep or the start"
            " sweep ends a hung listener",
        )
        return True

    def _judge_listener(self) -> tuple[bool, str]:
        """Whether the model's port answers: once is enough to be serving; hung only after
        PROBES failures, spread over PROBE_WINDOW seconds once one timed out (a loaded
        server may be slow to answer one), over BROKEN_WINDOW while each is refused at
        once (a server that answers with an error is broken, not busy). Judged once per
        sweep."""
        if self._health is None:
            answers, why, slow = False, "", False
            started = self.seams.clock()
            for attempt in range(PROBES):
                if attempt:
                    window = PROBE_WINDOW if slow else BROKEN_WINDOW
                    self.seams.sleep(window / (PROBES - 1))
                found = self.seams.health(self.model, self.state_dir)
                answers, why = found[0], found[1]
                slow = slow or (len(found) < 3 or bool(found[2]))  # type: ignore[misc]
                if answers:
                    break
            took = self.seams.clock() - started
            self._health = (
                answers,
                why if answers else f"{PROBES} probes over {took:.0f}s failed; the last: {why}",
            )
        return self._health

    # --- signalling ---------------------------------------------------------------------

    def _signal(self, target: Target, signum: signal.Signals) -> bool:
        """Send `signum` if the process is still the one listed; False if it is not, or
        if the signal is refused (then it is not ours: `target.foreign`)."""
        proc = target.proc
        if self.seams.before_signal is not None:
            self.seams.before_signal(proc, signum.name)
        if not target.same(self.seams.identity(proc.pid)):
            return False
        try:
            self.seams.kill(proc.pid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:  # its owner changed since the check (a setuid exec)
            target.foreign = True
            self.report.foreign(
                proc,
                self.seams.owner(proc.pid),
                target.holds_port,
                f"{signum.name} refused (another user's process): left alone",
            )
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
        """The targets still alive after up to `seconds` (bounded; returns early). A
        survivor the ledger already knows (it outlived an earlier sweep's SIGKILL and is
        still uninterruptible) is not waited for: it will not go before a reboot."""
        deadline = self.seams.clock() + seconds
        alive = [t for t in targets if self._alive(t)]
        while [t for t in alive if not self._known_survivor(t)] and self.seams.clock() < deadline:
            self.seams.sleep(POLL)
            alive = [t for t in alive if self._alive(t)]
        return alive

    def _known_survivor(self, target: Target) -> bool:
        if self._survivors is None:
            self._survivors = self.ledger.survivors()
        proc = target.proc
        return target.state is State.UNINTERRUPTIBLE and any(
            pid == proc.pid and abs(start - proc.create_time) <= IDENTITY_TOLERANCE
            for pid, start in self._survivors
        )

    def run(self) -> SweepReport:
        targets = self.plan()
        report = self.report
        report.targets = targets
        if self.dry_run:
            return report
        self.ledger.count_gone()
        self._note_ended(targets)
        sent: list[Target] = []
        for target in targets:
            if self._signal(target, signal.SIGTERM):
                sent.append(target)
            elif not target.foreign:
                self._changed(target)
        began = self.seams.clock()
        alive = self._wait(sent, self.grace)
        if [t for t in alive if not self._known_survivor(t)]:
            report.grace_waited = self.seams.clock() - began  # the grace ran out
        if alive and self.model.policy.sigkill:
            killed = []
            for target in alive:
                if self._signal(target, signal.SIGKILL):
                    killed.append(target)
                    self._record_spend(target)
                elif not target.foreign:
                    self._changed(target)
            alive = self._wait(killed, min(KILL_WAIT, max(self.grace, SIGKILL_WAIT)))
        report.survivors = alive
        for target in report.unkillable:
            self._record_survivor(target)
        survivors = {t.proc.pid for t in alive}
        report.exited = [
            t.proc.pid
            for t in targets
            if t.proc.pid not in survivors and t.proc.pid not in self._reused and not t.foreign
        ]
        return report

    def _note_ended(self, targets: list[Target]) -> None:
        """Before SIGTERM: the JACCL ranks a signal of ours ends, so their guards do not
        count them as vanished (a spend of unknown cause)."""
        ranks = [
            (t.proc.pid, t.proc.create_time, self.model.name, t.devices)
            for t in targets
            if is_jaccl_rank(t.proc)
        ]
        if ranks:
            self.ledger.ended(ranks)

    def _changed(self, target: Target) -> None:
        """Not signalled: gone already (it exited), or its pid is another process's now."""
        identity = self.seams.identity(target.proc.pid)
        if identity is not None and not target.same(identity):
            self._reused.add(target.proc.pid)
            self.report.spare(
                target.proc,
                "its pid now belongs to another process (pid"
                " reused between listing and signalling): not signalled",
            )

    def _record_spend(self, target: Target) -> None:
        proc = target.proc
        if not is_jaccl_rank(proc):
            return
        if self.ledger.spend(
            kind="sigkill",
            pid=proc.pid,
            start_time=proc.create_time,
            devices=target.devices,
            model=self.model.name,
        ):
            self.report.pd_spent += 1

    def _record_survivor(self, target: Target) -> None:
        """A survivor of SIGKILL holds its domains until reboot: one ledger entry per
        process (a JACCL rank SIGKILLed just now is the same spend, not another)."""
        proc = target.proc
        self.ledger.spend(
            kind="unkillable",
            pid=proc.pid,
            start_time=proc.create_time,
            devices=target.devices,
            model=self.model.name,
            cmdline=tuple(proc.cmdline),
            backend=backend_of(proc),
            holds_port=target.holds_port,
        )
