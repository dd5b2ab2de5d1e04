"""Is the model serving after a start? A real request, asked again until it answers or
the model's `start_timeout` has passed.

"Could not tell" is its own outcome (inconclusive), never "down": a probe that did not
run says nothing about the backend, so it must not trigger a fallback. Down at the end
of the wait (the last verdicts said down) is a failed verify. A verify that expects no
backend in particular reads the one it verified from the head's serve record (`facts`),
so `mlx_medic_last_verified_backend` follows a normal recover too; a head that cannot
say leaves it unknown (the model answered: the verify still passed).

A start that has visibly failed, where waiting cannot help, fails the verify at once, with
the line, instead of after the whole start_timeout (read from the head's `facts` while the
model is down, against where the head stood before the start):
- a site's start script (`service.kind: script`) wrote a JACCL error after the start
  (`Couldn't allocate protection domain`: a plain JACCL script fails the same way on
  every KeepAlive restart, and has no backend to fall back to): the run escalates;
- the serve wrapper counted a failed start after ours, every failure of it JACCL's, while
  the model has a ring backend it did not try (JACCL pinned): the run's ring pin is what
  helps. A wrapper that tried ring too, or failed for another reason, is waited for: its
  own relaunch may still bring the model up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import ClassVar

from mlx_medic.inventory.methods import BackendName
from mlx_medic.inventory.model import Model
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.remediator.model_health import HealthVerdict, ModelState
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import (
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
)
from mlx_medic.remediator.steps.facts import read_facts
from mlx_medic.remediator.steps.on_nodes import ask


@dataclass(frozen=True, kw_only=True)
class Verify(Step):
    """`backend`: the one expected to serve (after a pin); None: whichever the service
    chose (the serve wrapper, or a site's start script)."""

    kind: ClassVar[StepKind] = StepKind.VERIFY
    model: Model
    backend: BackendName | None = None
    # asked again after 1 s, then twice as long each time up to poll_interval: a model that
    # comes up in the first seconds is seen then, not a whole interval later
    first_poll: float = 1.0
    poll_interval: float = 5.0
    within: float | None = None  # how long to ask; None: the model's start_timeout
    # "still serving" (sweep-orphans): a model that did not answer before the run's steps
    # (a start or a crash in progress), or that stopped answering while they ran, is not
    # judged by this run, which never starts anything; LLMModelDown acts on one that stays
    # down
    only_if_answered_before: bool = False

    @property
    def wait(self) -> float:
        """How long it asks: `within`, else the model's start_timeout."""
        return self.model.policy.start_timeout if self.within is None else self.within

    def verifies(self) -> str:
        return "the start" if self.backend is None else f"the start on {self.backend}"

    def describe(self) -> StepDescription:
        where = f"{self.model.host}:{self.model.port}"
        asked = f", asked again for up to {self.wait:g}s" if self.wait > 0 else ", asked once"
        return StepDescription(
            "verify" if self.backend is None else f"verify-{self.backend}",
            self.model.head,
            f"health probe {where}: a real 1-token request{asked}",
            targets=[where],
        )

    async def run(self, context: RunContext) -> StepResult:
        if self.only_if_answered_before and context.answered_before is False:
            return StepResult(
                StepOutcome.SKIPPED,
                detail=(
                    f"{self.model.name} was not answering before the sweep (a start or a crash"
                    " in progress), so the sweep did not take it down; LLMModelDown acts on a"
                    " model that stays down"
                ),
            )
        deadline = time.monotonic() + self.wait
        pause = min(self.first_poll, self.poll_interval)
        while True:
            verdict = await context.health(self.model)
            if verdict.state is ModelState.UP:
                backend = self.backend or await self._served_backend(context)
                return StepResult(StepOutcome.OK, detail=verdict.reason, backend=backend)
            failed = await self._start_failed(context, verdict)
            if failed is not None:
                return failed
            if time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.poll_interval)
        if verdict.state is ModelState.DOWN and self.only_if_answered_before:
            # seen in the loop (tests/loop): a second crash between the re-check and here
            return StepResult(
                StepOutcome.SKIPPED,
                detail=(
                    f"{self.model.name} answered before the sweep and not after it"
                    f" ({verdict.reason}); the sweep ends only what the orphan rules name and"
                    " spares the process on the model's port, so this reads as a crash during"
                    " the run; LLMModelDown acts on a model that stays down"
                ),
            )
        if verdict.state is ModelState.DOWN:
            return StepResult(StepOutcome.FAILED, detail=verdict.reason)
        return StepResult(
            StepOutcome.INCONCLUSIVE,
            detail=f"could not tell whether {self.model.name} is up: {verdict.reason}",
        )

    async def _start_failed(self, context: RunContext, verdict: HealthVerdict) -> StepResult | None:
        """A failed verify when the model is down and the head shows its start failed in a
        way waiting cannot mend; None otherwise (ask again)."""
        marks = context.start_marks
        model = self.model
        script = model.service.kind == "script"
        wrapper_can_pin = (
            model.service.kind == "wrapper"
            and model.backends.ring is not None
            and model.backends.jaccl is not None
        )
        if (
            verdict.state is not ModelState.DOWN
            or marks is None
            or self.backend is not None
            or self.only_if_answered_before
            or not (script or wrapper_can_pin)
        ):
            return None
        head = model.head
        facts = read_facts(await ask(context, [head], FactsReply, model.name)).get(head)
        if facts is None:
            return None
        wait = f"so the run does not wait out its start_timeout ({self.wait:g}s)"
        if script:
            error = facts.jaccl_error_after(marks.log_sizes)
            if error is None:
                return None
            return StepResult(
                StepOutcome.FAILED,
                detail=(
                    f"{model.name} is down ({verdict.reason}) and its start script wrote a JACCL"
                    f" error after this start, on {error.host}: {error.line}; a plain JACCL"
                    f" script fails the same way on every restart, {wait}"
                ),
            )
        failure = facts.jaccl_start_failed_after(marks.failed_starts)
        if failure is None:
            return None
        return StepResult(
            StepOutcome.FAILED,
            detail=(
                f"{model.name} is down ({verdict.reason}) and the serve wrapper's start after"
                f" this one failed on JACCL alone, on {failure.host}: {failure.line}; ring was"
                f" not tried, {wait}"
            ),
        )

    async def _served_backend(self, context: RunContext) -> BackendName | None:
        """The backend the head's serve record says the live wrapper serves on (one of the
        model's); None when the head does not say."""
        head = self.model.head
        facts = read_facts(await ask(context, [head], FactsReply, self.model.name)).get(head)
        served = facts.serving_backend if facts is not None else None
        return next(
            (name for name, _spec in self.model.backends.in_order() if name == served), None
        )
