"""One run of the wrapper after it holds the lock: prepare the nodes, choose and smoke
test the backend, launch, wait for the model to answer, release the lock, and supervise.
How it ended is a `RunResult`; ending what is left of it is the caller's choice: the whole
teardown before the wrapper exits, or only the launch before a relaunch (whose start
sweep, at once and under the lock, ends every rank of the dead launch on every node).
One module at about 470 lines: the steps of a start share its record and its lock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import LockHandle, ModelLocks
from mlx_medic.serve.backend import (
    Candidate,
    boot_ids,
    candidates,
    fail_back,
    ledger_refusal,
    pin_ring_again,
    smoke_can_be_skipped,
)
from mlx_medic.serve.launch import (
    launch_argv,
    serve_args_warnings,
    server_command,
    smoke_command,
)
from mlx_medic.serve.nodes import LeaseKeeper, ModelNodes, StartRefused
from mlx_medic.serve.preseed import check_room, stage_weights
from mlx_medic.serve.record import BackendSuccess, Failure, RecordKeeper, ServeRecord, ServeState
from mlx_medic.serve.smoke import LAUNCH_RANK_LINE, Verdict, judge
from mlx_medic.serve.start import AlreadyServed, BlockedBySurvivor, phase, prepare_nodes
from mlx_medic.serve.supervise import SERVING_LINES_KEPT, Launch, remaining
from mlx_medic.serve.teardown import end_run, teardown_deadline
from mlx_medic.state.files import StateFileError
from mlx_medic.state.runs import run_env

log = logging.getLogger("mlx_medic.serve")

EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_BAD_ARGUMENTS = 2
EXIT_BUSY = 3
PROBE_EVERY = 0.25  # seconds between health probes while the model loads
WATCH_EVERY = 0.1  # seconds between looks at a serving launch


class Stopped(Exception):
    """A signal arrived: tear down and exit 0."""


@dataclass
class WrapperContext:
    """What the wrapper holds once it has the lock."""

    inventory: Inventory
    model: Model
    run_id: str
    holder: str  # "serve pid N on HEAD", written into every lease
    nodes: ModelNodes
    locks: ModelLocks
    lock: LockHandle
    stop: asyncio.Event  # set by SIGTERM/SIGINT
    records: RecordKeeper
    not_before: float = 0.0  # monotonic: no launch (smoke test included) before this
    crashed_run: str | None = None  # a relaunch: the run that crashed (its ranks go first)


@dataclass(frozen=True)
class RunResult:
    """How a run ended: the exit status if the wrapper stops now, and whether a relaunch
    may help (a crash while serving, or a start whose every backend failed; never a
    refusal, which a new launch would meet again)."""

    code: int
    relaunch: bool = False
    launched_at: float | None = None  # monotonic: when its last launch started


class ServeRun:
    def __init__(self, context: WrapperContext):
        self.w = context
        self.model = context.model
        self.locks = context.locks
        self.lock_held = True
        self.launch: Launch | None = None
        self.launched_at: float | None = None
        self.leases: LeaseKeeper | None = None
        self.cleaning: asyncio.Task[list[str]] | None = None
        self.recorded = False
        self.env = {**os.environ, **run_env(self.model.name, context.run_id)}

    @property
    def record(self) -> ServeRecord:
        return self.w.records.record

    async def run(self) -> RunResult:
        try:
            started = await self._start()
            if started is None:
                return self._result(EXIT_FAILED, relaunch=True)
            ok = await self._supervise()
            return self._result(EXIT_STOPPED if ok else EXIT_FAILED, relaunch=not ok)
        except Stopped:
            return self._result(EXIT_STOPPED)
        except AlreadyServed as exc:
            print(f"mlx-medic serve: {exc}", file=sys.stderr, flush=True)
            self.w.records.update("failed", failures=(Failure("start", self.model.head, str(exc)),))
            return self._result(EXIT_BUSY)
        except BlockedBySurvivor as exc:
            self._fail_start(
                [Failure("start", node, str(exc)) for node in exc.verdict.reboot_nodes],
                str(exc),
                reboot=tuple(exc.verdict.reboot_nodes),
            )
            return self._result(EXIT_FAILED)
        except StartRefused as exc:
            self._fail_start([], str(exc))
            return self._result(EXIT_FAILED)
        finally:
            await self._release_lock()

    def _result(self, code: int, relaunch: bool = False) -> RunResult:
        return RunResult(code, relaunch and not self.w.stop.is_set(), self.launched_at)

    # --- start -----------------------------------------------------------------------

    def _check_stop(self) -> None:
        if self.w.stop.is_set():
            raise Stopped

    async def _start(self) -> Candidate | None:
        from mlx_medic.state.backend_choice import read_backend_choice

        model, lease, inventory = self.model, self.model.serve.lease, self.w.inventory

        def recorded() -> None:  # from here on, nodes may hold the run: the teardown ends it
            self.recorded = True

        prepared = await prepare_nodes(
            self.w.nodes, self.w.run_id, lease, self.w.holder, recorded, self.w.crashed_run
        )
        self.cleaning = prepared.cleaning
        self.leases = LeaseKeeper(self.w.nodes, self.w.run_id, lease, self.w.holder)
        self.leases.start()
        self._check_stop()
        for warning in serve_args_warnings(model):
            log.warning("%s", warning)
        if model.serve.simulated_jaccl:
            log.warning(
                "JACCL is the testbed's simulation (serve.simulated_jaccl): never on a real cluster"
            )
        with phase("room check"):
            room = await check_room(self.w.nodes)
        if model.serve.preseed.enabled:
            await self._end_cleaning(wait=True)  # share's new tmp dir must not race it
            with phase("preseed"):
                await stage_weights(
                    inventory,
                    self.w.nodes,
                    self.w.run_id,
                    self.env,
                    room,
                    self.w.stop,
                    self._set_launch,
                )
            self._check_stop()
        ledgers = prepared.ledgers
        boots = boot_ids(ledgers)
        try:
            choice = read_backend_choice(inventory.state_dir, model.name)
            choice, lifted = fail_back(inventory.state_dir, model, choice, boots)
        except StateFileError as exc:  # a pin that cannot be read is no licence for JACCL
            raise StartRefused(f"the model's backend choice cannot be read: {exc}") from None
        if lifted:
            log.warning("backend: %s", lifted)
        tried, failures = candidates(model, choice)
        log.info(
            "backend choice %s%s",
            choice.choice,
            f" (by {choice.by}: {choice.reason})" if choice.by else "",
        )
        for index, candidate in enumerate(tried):
            self._check_stop()
            why = self._why(candidate, choice.pinned, failures)
            if candidate.name == "jaccl":
                refusal = ledger_refusal(model, ledgers, inventory)
                if refusal is not None:
                    log.warning("no JACCL start: %s", refusal.describe())
                    failures.append(refusal)
                    self._falling_back(tried, index)
                    continue
                why = "jaccl: the protection-domain ledger leaves room on every device"
            verdict = await self._smoke(candidate, boots, last=index == len(tried) - 1)
            if verdict.ok:
                if await self._launch(candidate, why, prepared.survivors.describe(inventory)):
                    self._came_up(candidate, boots)
                    return candidate
                verdict = self._launch_verdict()
            failure = Failure(candidate.name, verdict.host, verdict.reason, verdict.line)
            failures.append(failure)
            self.w.records.update(None, **{f"{candidate.name}_error_at": time.time()})
            log.error("%s did not start: %s", candidate.name, failure.describe())
            if candidate.name == "jaccl" and lifted:
                pin_ring_again(inventory.state_dir, model, boots, failure.describe())
                log.warning(
                    "backend: ring pinned again until the next reboot (JACCL failed"
                    " after the pin was lifted)"
                )
            await self._end_attempt()
            self._falling_back(tried, index)
        self._fail_start(failures, "no backend started")
        return None

    def _why(self, candidate: Candidate, pinned: bool, failures: list[Failure]) -> str:
        if pinned:
            return f"{candidate.name}: pinned"
        if failures:
            return f"{candidate.name}: " + "; ".join(f.describe() for f in failures)
        return candidate.name

    def _falling_back(self, tried: list[Candidate], index: int) -> None:
        following = tried[index + 1] if index + 1 < len(tried) else None
        if tried[index].name == "jaccl" and following is not None and following.name == "ring":
            pipeline = " with --pipeline" if following.backend.pipeline else ""
            log.warning("falling back to the ring backend%s", pipeline)

    def _came_up(self, candidate: Candidate, boots: dict[str, str]) -> None:
        success = BackendSuccess(boots, time.time())
        self.w.records.update(None, **{f"last_{candidate.name}_success": success})

    def _fail_start(
        self, failures: list[Failure], summary: str, reboot: tuple[str, ...] = ()
    ) -> None:
        self.w.records.update(
            "failed",
            failures=tuple(failures),
            reboot=reboot,
            failed_starts=self.record.failed_starts + 1,
        )
        said = "; ".join(f.describe() for f in failures if f.reason != summary)
        print(
            f"mlx-medic serve {self.model.name}: the start failed: {summary}"
            f"{': ' + said if said else ''}",
            file=sys.stderr,
            flush=True,
        )

    async def _wait_for_launch_slot(self) -> None:
        """The relaunch interval: launches of the model start at least that far apart."""
        wait = self.w.not_before - time.monotonic()
        if wait <= 0:
            return
        log.info("waiting %.1fs before launching (serve.relaunch_interval)", wait)
        with phase("relaunch interval"), contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.w.stop.wait(), wait)
        self._check_stop()

    async def _smoke(self, candidate: Candidate, boots: dict[str, str], last: bool) -> Verdict:
        model, inventory = self.model, self.w.inventory
        if candidate.name == "ring" and last:
            log.info(
                "ring smoke test skipped: ring is the last backend to try, and a ring"
                " that cannot start fails its launch (it never falls back silently)"
            )
            return Verdict(True)
        if smoke_can_be_skipped(self.record, boots, model.nodes, candidate.name):
            log.info(
                "%s smoke test skipped: its last start came up this boot and no %s error"
                " was seen since",
                candidate.name,
                candidate.name,
            )
            return Verdict(True)
        await self._wait_for_launch_slot()
        limit = model.serve.smoke_timeout
        log.info(
            "smoke test: %s all-reduce over %s (limit %gs)",
            candidate.name,
            ", ".join(model.nodes),
            limit,
        )
        argv = launch_argv(
            inventory,
            model,
            candidate.name,
            candidate.backend,
            self.w.run_id,
            smoke_command(model, candidate.name, inventory),
        )
        smoke = Launch(argv, self.env)
        with phase(f"{candidate.name} smoke test"):
            self.launched_at = time.monotonic()
            await smoke.start()
            waiting = asyncio.ensure_future(smoke.wait(limit))
            stopping = asyncio.ensure_future(self.w.stop.wait())
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        if not waiting.done():
            waiting.cancel()
            self.launch = smoke  # the teardown ends it
            raise Stopped
        timed_out = waiting.result() is None
        if timed_out:
            await smoke.end(model.policy.kill_grace)
        verdict = judge(smoke.output, list(model.nodes), timed_out, limit)
        log.info(
            "smoke test %s: %s",
            candidate.name,
            "ok" if verdict.ok else f"failed on {verdict.host}: {verdict.reason}",
        )
        return verdict

    async def _end_attempt(self) -> None:
        """Leave nothing of a failed attempt before the next (its ranks carry the run id)."""
        grace = min(self.model.policy.dead_launch_grace, self.model.policy.kill_grace)
        if self.launch is not None:
            await self.launch.end(grace)
            self.launch = None
        with phase("end of the failed attempt"):
            sweep = await self.w.nodes.sweep_run(
                self.w.run_id, timeout=self.w.nodes.timeout, launcher_dead=True
            )
        for problem in sweep.problems:
            log.error("after the failed attempt: %s", problem)
        if not sweep.complete:
            left = sweep.problems or [sweep.survivors.describe() if sweep.survivors else "?"]
            raise StartRefused(
                "a failed attempt's ranks could not all be ended: " + "; ".join(left)
            )

    async def _launch(self, candidate: Candidate, why: str, survivors: str) -> bool:
        """Start the model's ranks; True once the model answers (the lock then released)."""
        from mlx_medic.health import probe_host, probe_model_async

        model = self.model
        reason = why + (f"; survivors left: {survivors}" if survivors else "")
        self.w.records.update("starting", backend=candidate.name, backend_reason=reason)
        argv = launch_argv(
            self.w.inventory,
            model,
            candidate.name,
            candidate.backend,
            self.w.run_id,
            server_command(model, candidate.backend),
        )
        await self._wait_for_launch_slot()
        self.w.records.update(None, argv=tuple(argv))
        log.info("launching on %s (%s): %s", candidate.name, reason, " ".join(argv))
        self.launch = Launch(argv, self.env, on_line=self._on_line, keep=SERVING_LINES_KEPT)
        self.launched_at = time.monotonic()
        with phase(f"{candidate.name} launch to first answer"):
            await self.launch.start()
            host = probe_host(model.host)
            deadline = time.monotonic() + model.policy.start_timeout
            while True:
                self._check_stop()
                if not self.launch.running or self.launch.rank_ended:
                    return False
                if remaining(deadline) == 0:
                    return False
                result = await probe_model_async(host, model.port, timeout=10.0)
                if result.up:
                    break
                await asyncio.sleep(PROBE_EVERY)
        await self._release_lock()
        self.w.records.update("serving", backend=candidate.name, failures=(), reboot=())
        log.info(
            "serving %s on %s (run %s); the model lock is released",
            model.name,
            candidate.name,
            self.w.run_id,
        )
        return True

    def _launch_verdict(self) -> Verdict:
        launch = self.launch
        if launch is None:
            return Verdict(False, self.model.head, "mlx.launch did not start")
        if launch.rank_ended:
            match = LAUNCH_RANK_LINE.search(launch.rank_ended)
            rank = int(match.group(1)) if match else 0
            nodes = self.model.nodes
            return Verdict(
                False,
                nodes[rank] if rank < len(nodes) else f"rank {rank}",
                f"a rank ended: {launch.rank_ended}",
                launch.rank_ended,
            )
        if not launch.running:
            tail = next((x for x in reversed(launch.lines) if x.strip()), "")
            code = launch.process.returncode if launch.process else "?"
            return Verdict(
                False, self.model.head, f"mlx.launch exited {code} before the model answered", tail
            )
        return Verdict(
            False,
            self.model.head,
            "the model did not answer within"
            f" policy.start_timeout ({self.model.policy.start_timeout:g}s)",
        )

    def _on_line(self, line: str) -> None:
        from mlx_medic.serve.supervise import is_jaccl_error

        if self.record.backend == "jaccl" and is_jaccl_error(line):
            self.w.records.update(jaccl_error_at=time.time())

    # --- serving ---------------------------------------------------------------------

    async def _supervise(self) -> bool:
        """Until a signal (True) or a rank's failure or mlx.launch's exit (False)."""
        launch = self.launch
        assert launch is not None
        while not self.w.stop.is_set():
            if launch.rank_ended or not launch.running:
                verdict = self._launch_verdict()
                failure = Failure(
                    self.record.backend or "?", verdict.host, verdict.reason, verdict.line
                )
                self.w.records.update("failed", failures=(failure,))
                print(
                    f"mlx-medic serve {self.model.name}: {failure.describe()}",
                    file=sys.stderr,
                    flush=True,
                )
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.w.stop.wait(), WATCH_EVERY)
        return True

    # --- the end ---------------------------------------------------------------------

    async def _release_lock(self) -> None:
        if self.lock_held:
            self.lock_held = False
            try:
                await self.locks.release(self.w.lock)
            except Exception as exc:  # the lock judges a dead holder stale: say it, go on
                log.error("could not release the model lock: %s", exc)

    def _set_launch(self, launch: Launch | None) -> None:
        self.launch = launch

    async def _end_cleaning(self, wait: bool = False) -> None:
        """Cancel the clean, or with `wait` let it finish."""
        if self.cleaning is not None:
            if not self.cleaning.done() and not wait:
                self.cleaning.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.cleaning
            self.cleaning = None

    async def end_launch(self) -> None:
        """Before a relaunch: the leases stop and mlx.launch goes; the ranks it left are the
        next start sweep's (at once, under the lock, on every node)."""
        await self._end_cleaning()
        if self.leases is not None:
            await self.leases.stop()
        if self.launch is not None:
            await self.launch.end(
                min(self.model.policy.dead_launch_grace, self.model.policy.kill_grace)
            )

    async def teardown(self, result: RunResult) -> None:
        """Before the wrapper exits: every rank of the run on every node ended, the run
        cleared, the record's final state."""
        deadline = teardown_deadline(self.model)
        await self._end_cleaning()
        if self.leases is not None:
            await self.leases.stop()
        if self.recorded:
            with phase("teardown"):
                problems = await end_run(self.w.nodes, self.w.run_id, self.launch, deadline)
            if problems:
                print(
                    f"mlx-medic serve {self.model.name}: the teardown left: " + "; ".join(problems),
                    file=sys.stderr,
                    flush=True,
                )
            else:
                log.info("every rank of run %s is ended", self.w.run_id)
        stopped = self.w.stop.is_set()
        if stopped or self.record.state in ("starting", "serving"):
            state: ServeState = "stopped" if stopped or result.code == EXIT_STOPPED else "failed"
            if self.record.state != state:
                self.w.records.update(state)
