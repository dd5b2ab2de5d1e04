"""`sweep-orphans`' last word on the orphans: its nodes seen clean in two checks at least
`orphans_clean_window` apart, sweeping fresh orphans that appear meanwhile.

Why: the run holds the firing of the orphan alert it started from (fingerprint,
startsAt), and a firing is never run twice. Orphans that appear after the sweeps but
before Prometheus has scraped and evaluated a zero (a second crash of the same launch,
seconds later) carry on the SAME firing, so no new run would ever come for them
(Alertmanager re-sends a firing only at its repeat_interval, and the remediator answers
that repeat DUPLICATE). Two clean checks a window apart (the window at least one scrape
interval plus one evaluation interval: 15 s + 15 s for the rendered Prometheus, so 30 s
by default) mean Prometheus saw zero orphans in between, so the alert resolves, and any
orphans after the run make a new firing, and a new run.

Each check asks `node orphans MODEL` on every node of the model. Orphans an earlier run
found unkillable and named (`RunContext.known_unkillable`), and those this run's sweeps
found unkillable, do not count: no sweep ends them, only a reboot (their own alert,
`MLXUnkillableSurvivors`, pages for it). Clean now: wait the window and check again;
clean again: the step ends ok. Fresh orphans: they are swept on the nodes that report
them (the `Sweep` step, orphans only) and the checks start over. After `resweeps`
re-sweeps with orphans still coming back, the step fails naming nodes and pids and the
run escalates (`unrecoverable`: something keeps leaving orphans, a person must look)
instead of sweeping forever. Every check and re-sweep is a line of the step's detail and
of the remediator's log; the nodes' answers are its output.

It comes before the playbook's verify because the runner ends a run at a verify that
passes; the verify then judges the model after the last re-sweep. Once the last check
is done the run is settled (`RunContext.settle`): an orphan alert that arrives after it
(a new firing, from orphans that appeared since) is not absorbed by a run that will not
look again, but gets a run of its own, queued after this one. A run of the model
queued after this one (`recover` for a model-down alert: it stops, sweeps every node and
starts; or a sweep of nodes this run does not act on) ends the window's wait at once, so
it does not wait the window out; it sweeps, and confirms, again. So does a model that
answered at the re-check and stops answering during the window (probed every 5 s): the
run holds the model lock, and the serve wrapper's restart, refused while it is held,
must not wait for the window either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mlx_medic.inventory.model import Model
from mlx_medic.node.replies import OrphansReply, ProcessEntry
from mlx_medic.remediator.model_health import ModelState
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.run_survivors import merged_survivors
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.on_nodes import ask, not_answered
from mlx_medic.remediator.steps.sweep import Sweep

# The rendered Prometheus's 15 s scrape plus its 15 s rule evaluation (mlx_medic/render).
DEFAULT_CLEAN_WINDOW = 30.0
MAX_RESWEEPS = 3  # re-sweeps of orphans that came back before the run escalates
CHECK_UNREACHABLE = (
    "the orphans could not be checked after the sweep: check that {nodes} is up and"
    " answers SSH, then read `mlx_orphan_processes` for them"
)
HEALTH_POLL = 5.0  # seconds between probes of a serving model during the window
QUEUED_AFTER = (
    "another run of {model} is queued to act after this one and sweeps again (recover, for"
    " a model that went down, or a sweep of nodes this run does not act on): the check"
    " ends here"
)
WENT_DOWN = (
    "{model} stopped answering during the window ({reason}): the check ends here, so the"
    " run lets go of the model lock for the service's restart (its start sweep) or"
    " LLMModelDown's recover"
)
Identity = tuple[str, int, float]
Sleep = Callable[[float], Awaitable[None]]


def _named(fresh: dict[str, list[ProcessEntry]]) -> str:
    return "; ".join(
        f"{node}: " + ", ".join(f"pid {o.pid} ({o.rule or '?'})" for o in orphans)
        for node, orphans in fresh.items()
    )


@dataclass(frozen=True, kw_only=True)
class ConfirmClean(Step):
    """Two clean checks `window` seconds apart on every node of `model`; fresh orphans
    meanwhile are swept (up to `resweeps` times). See the module."""

    model: Model
    window: float = DEFAULT_CLEAN_WINDOW
    resweeps: int = MAX_RESWEEPS
    sleep: Sleep = field(default=asyncio.sleep, compare=False, repr=False)  # a test's clock
    health_poll: float = HEALTH_POLL

    def describe(self) -> StepDescription:
        nodes = ", ".join(self.model.nodes)
        return StepDescription(
            "confirm-clean",
            nodes,
            f"ask `mlx-medic node orphans {self.model.name}` on {nodes} until two checks"
            f" {self.window:g}s apart find no orphan (so Prometheus has seen zero and the"
            " orphan alert resolves; unkillable ones already named do not count); fresh"
            f" orphans meanwhile are swept (orphans only) and the checks start over, at most"
            f" {self.resweeps} times, then the run escalates",
            targets=[f"{self.model.name} on {node}" for node in self.model.nodes],
        )

    def timeout(self, default: float) -> float:
        """Each round: a check, a window, a check and a sweep (each within `default`)."""
        return (self.resweeps + 1) * (self.window + 3 * default)

    async def _wait_window(self, context: RunContext) -> str | None:
        """Wait the window; why to stop checking instead, at once, when another run of the
        model is queued after this one, or when the model, which answered at the re-check,
        stops answering (it holds the model lock: a restart of the serve wrapper would be
        refused until the run ends). None: the window passed."""
        watches: dict[asyncio.Future[Any], str] = {}
        successor = context.successor
        if successor is not None:
            if successor.is_set():
                return QUEUED_AFTER.format(model=self.model.name)
            watches[asyncio.ensure_future(successor.wait())] = QUEUED_AFTER
        if context.answered_before:
            watches[asyncio.ensure_future(self._until_down(context))] = WENT_DOWN
        window = asyncio.ensure_future(self.sleep(self.window))
        try:
            await asyncio.wait({window, *watches}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (window, *watches):
                task.cancel()
        for task, why in watches.items():
            if task.done() and not task.cancelled():
                return why.format(model=self.model.name, reason=task.result() or "")
        return None

    async def _until_down(self, context: RunContext) -> str:
        """The probe's reason once the model does not answer (asked every `health_poll`)."""
        while True:
            await asyncio.sleep(self.health_poll)
            verdict = await context.health(self.model)
            if verdict.state is ModelState.DOWN:
                return verdict.reason

    async def run(self, context: RunContext) -> StepResult:
        model, nodes = self.model, list(self.model.nodes)
        ignored: set[Identity] = set(context.known_unkillable)
        if context.survivors is not None:  # this run's sweeps named them
            ignored |= {s.identity for s in context.survivors.survivors}
        said: list[str] = []
        outputs: list[str] = []
        swept = StepResult(StepOutcome.OK)  # what the re-sweeps found unkillable, merged
        resweeps, clean_before = 0, False

        def note(line: str) -> None:
            said.append(line)
            context.log.info("run %s, %s: %s", context.run_id, model.name, line)

        def ended(result: StepResult, detail: str) -> StepResult:
            result.detail = "; ".join([*said, detail])
            result.output = "\n".join(part for part in [*outputs, result.output] if part)
            result.survivors, result.unkillable = swept.survivors, swept.unkillable
            return result

        check = 0
        while True:  # at most 2 * (resweeps + 1) checks: a re-sweep follows each unclean one
            check += 1
            replies = await ask(context, nodes, OrphansReply, model.name)
            unanswered = not_answered(replies, "the orphan check", CHECK_UNREACHABLE)
            if unanswered is not None:
                return ended(unanswered, unanswered.detail)
            outputs.append(replies.output())
            fresh: dict[str, list[ProcessEntry]] = {}
            left_alone = 0
            for node, reply in replies.replies.items():
                for orphan in reply.answer.orphans:
                    if (node, *orphan.identity) in ignored:
                        left_alone += 1
                    else:
                        fresh.setdefault(node, []).append(orphan)
            also = f" ({left_alone} unkillable one(s) already named left out)" if left_alone else ""
            if not fresh:
                if clean_before:
                    context.settle()
                    return ended(
                        StepResult(StepOutcome.OK),
                        f"check {check}: clean again {self.window:g}s later{also}: Prometheus"
                        " has seen no orphans, so the orphan alert resolves",
                    )
                note(f"check {check}: no orphans on {', '.join(nodes)}{also}")
                clean_before = True
                stopped = await self._wait_window(context)
                if stopped is not None:
                    context.settle()
                    return ended(StepResult(StepOutcome.OK), stopped)
                continue
            clean_before = False
            if resweeps == self.resweeps:
                result = StepResult(
                    StepOutcome.FAILED,
                    unrecoverable=True,
                    next_action=(
                        f"find what keeps leaving orphans of {model.name} on"
                        f" {', '.join(fresh)} (a crash loop: the model's service logs) and"
                        f" stop it; `mlx-medic log --model {model.name}` has every check"
                    ),
                )
                return ended(
                    result,
                    f"check {check}: orphans keep coming back after {resweeps} re-sweep(s):"
                    f" {_named(fresh)}",
                )
            resweeps += 1
            note(
                f"check {check}: orphans again: {_named(fresh)}; re-sweep {resweeps} of"
                f" {self.resweeps}"
            )
            result = await Sweep(model=model, nodes=tuple(fresh), orphans_only=True).run(context)
            if result.survivors is not None:
                swept.survivors = merged_survivors(swept.survivors, result.survivors)
            if result.unkillable is not None:
                swept.unkillable = {**(swept.unkillable or {}), **result.unkillable}
                ignored |= {
                    (node, pid, start)
                    for node, found in result.unkillable.items()
                    for pid, start in found
                }
            if result.outcome is not StepOutcome.OK:
                return ended(result, f"re-sweep {resweeps} failed: {result.detail}")
            outputs.append(result.output)
            note(f"re-sweep {resweeps}: {result.detail}")
