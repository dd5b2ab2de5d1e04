"""One run of the wrapper after it holds the lock: prepare the nodes, choose and smoke
test the backend, launch, wait for the model to answer, release the lock, supervise,
and end every rank of the run on any exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass

from mlx_medic.inventory import Inventory, Model
from mlx_medic.model_lock import LockHandle, ModelLocks
from mlx_medic.runs import run_env
from mlx_medic.serve.backend import (
    Candidate,
    boot_ids,
    candidates,
    ledger_refusal,
    smoke_can_be_skipped,
)
from mlx_medic.serve.launch import (
    launch_argv,
    serve_args_warnings,
    server_command,
    smoke_command,
)
from mlx_medic.serve.nodes import LeaseKeeper, ModelNodes, StartRefused
from mlx_medic.serve.record import Failure, JacclSuccess, RecordKeeper, ServeRecord, ServeState
from mlx_medic.serve.smoke import LAUNCH_RANK_LINE, Verdict, judge
from mlx_medic.serve.supervise import SERVING_LINES_KEPT, Launch, remaining
from mlx_medic.serve.teardown import end_run, teardown_deadline
from mlx_medic.state_files import StateFileError

log = logging.getLogger("mlx_medic.serve")

EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_BAD_ARGUMENTS = 2
EXIT_BUSY = 3
PROBE_EVERY = 2.0


class Stopped(Exception):
    """A signal arrived: tear down and exit 0."""


@dataclass
class RunContext:
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


class ServeRun:
    def __init__(self, context: RunContext):
        self.w = context
        self.model = context.model
        self.locks = context.locks
        self.lock_held = True
        self.launch: Launch | None = None
        self.leases: LeaseKeeper | None = None
        self.recorded = False
        self.env = {**os.environ, **run_env(self.model.name, context.run_id)}

    @property
    def record(self) -> ServeRecord:
        return self.w.records.record

    async def run(self) -> int:
        served = False
        try:
            started = await self._start()
            if started is None:
                return EXIT_FAILED
            served = True
            return EXIT_STOPPED if await self._supervise() else EXIT_FAILED
        except Stopped:
            return EXIT_STOPPED
        except StartRefused as exc:
            self._fail_start([], str(exc))
            return EXIT_FAILED
        finally:
            await self._release_lock()
            stopped = self.w.stop.is_set()
            await self._teardown()
            if served or stopped:
                state: ServeState = "stopped" if stopped else "failed"
                if self.record.state != state:
                    self.w.records.update(state)

    # --- start -----------------------------------------------------------------------

    def _check_stop(self) -> None:
        if self.w.stop.is_set():
            raise Stopped

    async def _start(self) -> Candidate | None:
        from mlx_medic.backend_choice import read_backend_choice
        from mlx_medic.serve.start import record_run, sweep_and_clean

        model, lease = self.model, self.model.serve.lease
        await sweep_and_clean(self.w.nodes)
        self.recorded = True  # from here on, nodes may hold the run: the teardown ends it
        await record_run(self.w.nodes, self.w.run_id, lease, self.w.holder)
        self.leases = LeaseKeeper(self.w.nodes, self.w.run_id, lease, self.w.holder)
        self.leases.start()
        self._check_stop()
        for warning in serve_args_warnings(model):
            log.warning("%s", warning)
        try:
            choice = read_backend_choice(self.w.inventory.state_dir, model.name)
        except StateFileError as exc:  # a pin that cannot be read is no licence for JACCL
            raise StartRefused(f"the model's backend choice cannot be read: {exc}") from None
        tried, failures = candidates(model, choice)
        log.info("backend choice %s%s", choice.choice,
                 f" (by {choice.by}: {choice.reason})" if choice.pinned else "")  # fmt: skip
        ledgers = await self.w.nodes.ledgers()
        boots = boot_ids(ledgers)
        for candidate in tried:
            self._check_stop()
            if candidate.name == "jaccl":
                refusal = ledger_refusal(model, ledgers)
                if refusal is not None:
                    log.warning("no JACCL start: %s", refusal.describe())
                    failures.append(refusal)
                    continue
            verdict = await self._smoke(candidate, boots)
            if verdict.ok:
                if await self._launch(candidate):
                    if candidate.name == "jaccl":
                        self.w.records.update(
                            last_jaccl_success=JacclSuccess(boots, time.time()))
                    return candidate
                verdict = self._launch_verdict()
            failure = Failure(candidate.name, verdict.host, verdict.reason, verdict.line)
            failures.append(failure)
            if candidate.name == "jaccl":
                self.w.records.update(jaccl_error_at=time.time())
            log.error("%s did not start: %s", candidate.name, failure.describe())
            await self._end_attempt()
            if candidate.name == "jaccl" and any(c.name == "ring" for c in tried):
                log.warning("falling back to the ring backend with --pipeline")
        self._fail_start(failures, "no backend started")
        return None

    def _fail_start(self, failures: list[Failure], summary: str) -> None:
        self.w.records.update("failed", failures=tuple(failures),
                              failed_starts=self.record.failed_starts + 1)
        said = "; ".join(f.describe() for f in failures)
        print(f"mlx-medic serve {self.model.name}: the start failed: {summary}"
              f"{': ' + said if said else ''}",
              file=sys.stderr, flush=True)  # fmt: skip

    async def _smoke(self, candidate: Candidate, boots: dict[str, str]) -> Verdict:
        model, inventory = self.model, self.w.inventory
        if candidate.name == "jaccl" and smoke_can_be_skipped(self.record, boots, model.nodes):
            log.info("JACCL smoke test skipped: the last JACCL start came up this boot and no"
                     " JACCL error was seen since")  # fmt: skip
            return Verdict(True)
        limit = model.serve.smoke_timeout
        log.info("smoke test: %s all-reduce over %s (limit %gs)", candidate.name,
                 ", ".join(model.nodes), limit)  # fmt: skip
        argv = launch_argv(inventory, model, candidate.name, candidate.backend, self.w.run_id,
                           smoke_command(model, candidate.name, inventory))  # fmt: skip
        smoke = Launch(argv, self.env)
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
        log.info("smoke test %s: %s", candidate.name, "ok" if verdict.ok else
                 f"failed on {verdict.host}: {verdict.reason}")  # fmt: skip
        return verdict

    async def _end_attempt(self) -> None:
        """Leave nothing of a failed attempt before the next (its ranks carry the run id)."""
        if self.launch is not None:
            await self.launch.end(self.model.policy.kill_grace)
            self.launch = None
        sweep = await self.w.nodes.sweep_run(self.w.run_id, timeout=self.w.nodes.timeout)
        for problem in sweep.problems:
            log.error("after the failed attempt: %s", problem)
        if not sweep.complete:
            raise StartRefused("a failed attempt's ranks could not all be ended: "
                               + "; ".join(sweep.problems))  # fmt: skip

    async def _launch(self, candidate: Candidate) -> bool:
        """Start the model's ranks; True once the model answers (the lock then released)."""
        from mlx_medic.health import probe_host, probe_model_async

        model = self.model
        self.w.records.update("starting", backend=candidate.name)
        argv = launch_argv(self.w.inventory, model, candidate.name, candidate.backend,
                           self.w.run_id, server_command(model, candidate.backend))  # fmt: skip
        log.info("launching on %s: %s", candidate.name, " ".join(argv))
        self.launch = Launch(argv, self.env, on_line=self._on_line, keep=SERVING_LINES_KEPT)
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
        self.w.records.update("serving", backend=candidate.name, failures=())
        log.info("serving %s on %s (run %s); the model lock is released", model.name,
                 candidate.name, self.w.run_id)  # fmt: skip
        return True

    def _launch_verdict(self) -> Verdict:
        launch = self.launch
        if launch is None:
            return Verdict(False, self.model.head, "mlx.launch did not start")
        if launch.rank_ended:
            match = LAUNCH_RANK_LINE.search(launch.rank_ended)
            rank = int(match.group(1)) if match else 0
            nodes = self.model.nodes
            return Verdict(False, nodes[rank] if rank < len(nodes) else f"rank {rank}",
                           f"a rank ended: {launch.rank_ended}",
                           launch.rank_ended)  # fmt: skip
        if not launch.running:
            tail = next((x for x in reversed(launch.lines) if x.strip()), "")
            code = launch.process.returncode if launch.process else "?"
            return Verdict(False, self.model.head,
                           f"mlx.launch exited {code} before the model answered", tail)
        return Verdict(False, self.model.head, "the model did not answer within"
                       f" policy.start_timeout ({self.model.policy.start_timeout:g}s)")

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
                failure = Failure(self.record.backend or "?", verdict.host, verdict.reason,
                                  verdict.line)  # fmt: skip
                self.w.records.update("failed", failures=(failure,))
                print(f"mlx-medic serve {self.model.name}: {failure.describe()}; ending every"
                      " rank of the run", file=sys.stderr, flush=True)  # fmt: skip
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.w.stop.wait(), 1.0)
        return True

    # --- the end ---------------------------------------------------------------------

    async def _release_lock(self) -> None:
        if self.lock_held:
            self.lock_held = False
            try:
                await self.locks.release(self.w.lock)
            except Exception as exc:  # the lock judges a dead holder stale: say it, go on
                log.error("could not release the model lock: %s", exc)

    async def _teardown(self) -> None:
        deadline = teardown_deadline(self.model)
        if self.leases is not None:
            await self.leases.stop()
        if not self.recorded:
            return  # refused before any node held the run: nothing of it runs anywhere
        problems = await end_run(self.w.nodes, self.w.run_id, self.launch, deadline)
        if problems:
            print(f"mlx-medic serve {self.model.name}: the teardown left: "
                  + "; ".join(problems), file=sys.stderr, flush=True)  # fmt: skip
        else:
            log.info("every rank of run %s is ended", self.w.run_id)

