"""A model's run settings: `models.<name>.policy` (limits on automatic action) and
`models.<name>.serve` (how `mlx-medic serve` launches and keeps the ranks)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field, field_validator

from mlx_medic.inventory.fields import AbsolutePath, Duration, StrictModel

# What `serve.preseed.command` may name, each a whole argument of it (mlx_medic.serve.preseed)
PRESEED_PLACEHOLDERS = {
    "{path}": "the weights' dir (`path`), the same on every node",
    "{tmpdir}": "the dir beside it to stage in (a `tmp*` entry there is the clean's)",
    "{head}": "the head's `ssh` address (the node that holds the weights)",
}
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


class Policy(StrictModel):
    """Limits on automatic action, so a restart loop cannot spend the PD budget."""

    restart_budget: int = Field(
        default=3,
        ge=0,
        le=100,
        description="automatic runs allowed per `window`; when spent, the model's circuit"
        " opens and on-call is told",
    )
    window: Duration = Field(
        default=3600.0,
        description="the span `restart_budget` counts over, on the wall clock (the journal"
        " keeps the runs' times across restarts): the remediator's clock set forward past the"
        " window ages its runs out, set back keeps them in it longer",
    )
    backoff: Duration = Field(
        default=30.0,
        description="the wait after the first counted run in the window; it doubles with each"
        " further run. Never longer than that when the remediator's clock is set back: a last"
        " run in the clock's future is waited for on the monotonic clock from when the"
        " remediator first saw it so",
    )
    start_timeout: Duration = Field(
        default=600.0,
        description="the time a start gets to answer the health probe (the playbook's verify"
        " step); also bounds a step's run time, with `ssh.command_timeout`",
    )
    pd_reserve: int = Field(
        default=5,
        ge=0,
        le=11,
        description="no JACCL start is tried on a node where a device the start needs (its"
        " row of the JACCL hostfile) has spent this many protection domains since the boot,"
        " by the node's ledger (of about 11 per RDMA device; a SIGKILLed, vanished or"
        " unkillable JACCL rank spends one on each of its devices until reboot, a failed"
        " allocation spends nothing). 5 after dryvist/nix-ai's cap of 5 of 11, which keeps"
        " domains for a person to recover with; 0: never JACCL",
    )
    kill_grace: Duration = Field(
        default=10.0,
        description="a sweep's wait between SIGTERM and SIGKILL, for a rank to end itself",
    )
    dead_launch_grace: Duration = Field(
        default=0.25,
        description="the serve wrapper's wait between SIGTERM and SIGKILL for the ranks of a"
        " launch whose mlx.launch is gone (its start sweep, its teardown after a crash), at"
        " most kill_grace: an orphan stuck in the RDMA driver ignores SIGTERM and may turn"
        " unkillable while it is waited for (docs/decisions.md)",
    )
    sigkill: bool = Field(
        default=True,
        description="whether a sweep may SIGKILL what SIGTERM left (a SIGKILLed JACCL rank"
        " spends a protection domain until reboot, which the ledger counts); false: survivors"
        " of SIGTERM are reported, never killed",
    )
    stop_timeout: Duration = Field(
        default=60.0,
        description="the serve wrapper ends every rank of its run within this after SIGTERM;"
        " rendered service files wait longer before their own SIGKILL",
    )
    stale_tmp_age: Duration = Field(
        default=600.0,
        description="a `tmp*` entry in `tmp_dirs`/`cache_dirs` unchanged this long, and used by"
        " no live process, is stale; in a dir other models on the node also name, only once"
        " it is older than every one of their ages",
    )


class Preseed(StrictModel):
    """Weights staged to the nodes that lack them before the smoke test (the seed's
    mlx-preseed.sh pre-seeding), with mlx_lm.share launched as a run of the model."""

    enabled: bool = Field(
        default=False,
        description="stage the weights at `path` from the head to every node of the model"
        " whose copy differs from the head's (names and sizes of its files) or is missing,"
        " with the real `mlx_lm.share` over the ring hostfile's nodes, after the start sweep"
        " and the clean and before the smoke test; its ranks carry the run id, so the next"
        " start sweep ends what a crash left. Needs the ring backend",
    )
    path: AbsolutePath | None = Field(
        default=None,
        description="the weights' dir, the same path on every node (a Hugging Face repo's"
        " cache dir `.../hub/models--ORG--NAME` as `mlx_lm share --model` shares it, or a"
        " local model dir); share stages it in a `tmp*` dir beside it, which must be one of"
        " the model's `tmp_dirs` or `cache_dirs` so the clean removes what a killed share"
        " left; null: the model's `model` when it is an absolute path",
    )
    command: list[str] | None = Field(
        default=None,
        min_length=1,
        description="an argv (no shell) launched instead of `mlx_lm share`, the same way: "
        "mlx.launch (ring) over the ring hostfile's rows of the head and the receivers,"
        " each rank under the rank guard with the run id in its environment, so the "
        "start sweep ends what a crash left (its processes, children too, by MLX_RANK "
        "and the run id in their environment: one that drops its environment is not "
        "found). Rank 0 (`MLX_RANK=0`) is the head, which sends; every other rank is a "
        "receiver, which must leave the head's files at `{path}` when it exits 0 (the "
        "wrapper then compares them as `compare` says). The first word is an absolute "
        "executable on every node; a word that is exactly `{path}` (the weights' dir), "
        "`{tmpdir}` (its parent: stage in a `tmp*` entry there, which the clean removes"
        " once a killed command left it) or `{head}` (the head's `ssh` address) is "
        "replaced; any other `{word}` is an error. null: the real `mlx_lm share --path "
        "{path} --tmpdir {tmpdir}`",
    )
    compare: Literal["sizes", "sha256"] = Field(
        default="sizes",
        description="what makes a node's copy the head's: `sizes`, the same file names and"
        " sizes (cheap: a directory walk); `sha256`, also the same SHA-256 of every file,"
        " read in full by the `node room` helper on every node at every start and again on"
        " the head and the receivers after staging (a start waits for the slowest node's"
        " read of the whole weights). A node whose copy differs is named and nothing is"
        " started: share cannot replace a dir that is there",
    )

    @field_validator("command")
    @classmethod
    def _command_words(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not Path(value[0]).is_absolute() or ".." in Path(value[0]).parts:
            raise ValueError(
                f"its first word {value[0]!r} must be an absolute"
                " executable (no PATH lookup on the nodes)"
            )
        for word in value:
            if word in PRESEED_PLACEHOLDERS:
                continue
            unknown = _PLACEHOLDER.findall(word)
            if unknown:
                raise ValueError(
                    f"{word!r} holds {', '.join(unknown)}: a placeholder"
                    f" is a whole argument, one of {', '.join(PRESEED_PLACEHOLDERS)}"
                )
        return value


class ServeSettings(StrictModel):
    """How `mlx-medic serve` starts the model's ranks and keeps them tied to itself."""

    python: AbsolutePath | None = Field(
        default=None,
        description="the interpreter the ranks start with on every node (`mlx.launch"
        " --python`: one path for all hosts, so keep MLX and mlx-medic in a venv at the same"
        " path on each node; the rank guard runs in it too); null: the interpreter that runs"
        " `mlx-medic serve`",
    )
    starting_port: int | None = Field(
        default=None,
        ge=1024,
        le=65000,
        description="`mlx.launch --starting-port` for this model's ring (and its smoke test):"
        " two models on one node need ranges of their own; null: mlx.launch's default,"
        " which only one model per node may use",
    )
    smoke_timeout: Duration = Field(
        default=60.0,
        description="the time limit of the smoke test (a short all-reduce over every rank"
        " through mlx.launch); past it the test has failed and its ranks are ended",
    )
    lease: Duration = Field(
        default=10.0,
        description="the run's lease on each node, renewed by the wrapper every quarter of it;"
        " a guard beside each rank ends it once the lease runs out, so after a SIGKILLed"
        " wrapper no rank lives much longer than this",
    )

    relaunch_limit: int = Field(
        default=5,
        ge=0,
        le=100,
        description="after a crash (or a start whose backends all failed) the wrapper ends"
        " what is left and launches again itself, up to this many times per"
        " relaunch_window, instead of exiting into the service manager's restart throttle"
        " (launchd: 10s); then it exits 1 and the service manager restarts it. 0: exit at"
        " once",
    )
    relaunch_window: Duration = Field(
        default=600.0,
        description="the span relaunch_limit counts over",
    )
    relaunch_interval: Duration = Field(
        default=10.0,
        description="two launches of the model (a relaunch's and the one before it) start at"
        " least this far apart, as launchd's default ThrottleInterval spaces KeepAlive"
        " restarts, so a crash loop spends protection domains no faster than one under"
        " KeepAlive; the start sweep still runs at once (orphans are caught while killable)",
    )
    memory_needed: ByteSize | None = Field(
        default=None,
        description="the memory a rank of the model needs free on each node before a start"
        " (`96GB`, `40GiB`); a node with less (psutil's available memory; on macOS also no"
        " more than a nonzero `iogpu.wired_limit_mb`) is named and nothing is started. null:"
        " the weights' size (`preseed.path`, else a local `model` dir) divided by the number"
        " of nodes, plus 20%; no check when neither is known",
    )
    preseed: Preseed = Field(
        default_factory=Preseed,
        description="stage the weights to nodes that lack them before the smoke test",
    )
    simulated_jaccl: bool = Field(
        default=False,
        description="test-only: JACCL is the testbed's simulation (serve.python is its"
        " shim; testbed/README.md). `check-config` refuses it unless"
        " --allow-simulated-jaccl; the wrapper logs a warning at every start",
    )

    identity_file: AbsolutePath | None = Field(
        default=None,
        description="the private key the wrapper logs in to the model's other nodes with, to"
        " run the node helpers there (`mlx-medic render authorized-keys` pins its `.pub` on"
        " them to what the wrapper sends, `--key serve`; the remediator's key refuses the"
        " wrapper's start sweep); host keys are"
        " checked against `ssh.known_hosts`; null: the service user's own default keys, as"
        " mlx.launch's ssh uses",
    )

    @field_validator("lease")
    @classmethod
    def _lease_positive(cls, value: float) -> float:
        if value < 3:
            raise ValueError("a lease shorter than 3s cannot be renewed in time over SSH")
        return value
