"""The words for how steps and runs end, defined once.

The journal stores these values as they are (old journals stay readable), the metrics
use them as label values and the on-call page and `mlx-medic log` show them; an enum
makes a typo a failure at import, not a run that no query finds.
"""

from __future__ import annotations

from enum import StrEnum


class StepOutcome(StrEnum):
    """How one step of a run ended (`running` while it runs)."""

    RUNNING = "running"  # journaled before the step starts: a crash leaves it visible
    OK = "ok"
    FAILED = "failed"
    PLANNED = "planned"  # dry run: journaled, never executed
    NOT_IMPLEMENTED = "not_implemented"  # old journals only: a step without a body then
    INCONCLUSIVE = "inconclusive"  # could not tell (e.g. a verify whose probe gave no answer)
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"  # the remediator stopped while the step ran
    UNREACHABLE = "unreachable"  # the step's node did not answer
    # Old journals only: a sweep that found processes surviving SIGKILL ended so then; a
    # sweep now ends ok naming them (they are no failure: only a reboot ends them)
    UNKILLABLE = "unkillable"


class RunOutcome(StrEnum):
    """How a run ended (`queued`/`running` while in flight)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # verified healthy after the playbook
    # the run broke (an internal error), or the head's lock helper answered with an error
    # (no holder found, nothing was done); nothing escalated
    FAILED = "failed"
    ESCALATED = "escalated"  # handed to a person; the circuit is open
    PLANNED = "planned"  # dry run: every step journaled, nothing executed
    SKIPPED = "skipped"  # the playbook's re-check found nothing to do, or was paused
    # another holder had the model lock, or its holder could not be judged (an alert's run
    # waits lock_wait); the detail names the head and the holder, the next action the way
    LOCKED = "locked"
    CANCELLED = "cancelled"  # resolved while still queued
    INTERRUPTED = "interrupted"  # the process stopped (crash, kill, shutdown) mid-run
    INCONCLUSIVE = "inconclusive"  # acted, then could not tell whether the model is up
    UNREACHABLE = "unreachable"  # a node the run needed did not answer (nothing was done)
    # a node's mlx-medic cannot serve the run as deployed: its inventory unreadable,
    # mlx-medic missing, its forced command refusing, another version (nothing was done)
    MISCONFIGURED = "misconfigured"


RUN_IN_FLIGHT = (RunOutcome.QUEUED, RunOutcome.RUNNING)
RUN_ENDED = tuple(outcome for outcome in RunOutcome if outcome not in RUN_IN_FLIGHT)
# A firing (fingerprint, startsAt) stays handled while its run is in flight and after its
# run succeeded (a dry run: planned): a repeat notification of it is a duplicate. Every
# other ending (locked, unreachable, misconfigured, inconclusive, skipped, escalated,
# failed, ...) did not fix the model, so a later notification of the same firing may start
# a new run.
RUN_HOLDS_FIRING = (*RUN_IN_FLIGHT, RunOutcome.SUCCEEDED, RunOutcome.PLANNED)


class EscalationReason(StrEnum):
    """Why a model's circuit opened: the `reason` label of mlx_medic_escalations_total."""

    BUDGET_SPENT = "budget_spent"
    UNRECOVERABLE = "unrecoverable"
    STEP_FAILED = "step_failed"
