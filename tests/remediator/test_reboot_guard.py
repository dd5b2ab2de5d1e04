"""The guards of a reboot by the remediator: each refusal names its guard; with every guard
holding, the reboot is allowed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlx_medic.remediator.reboot_guard import ClusterView, ModelView, reboot_refusal

ON_RING = ModelView(
    name="glm",
    serving=True,
    backend="ring",
    healthy_nodes=frozenset({"ai001", "ai002", "ai003"}),
    paused=False,
    survivors_hold_its_domains=True,
)
DAY = 86400.0
ALLOWED = ClusterView(
    node="ai002", allowed=True, booted_at=0.0, now=DAY, min_uptime=3600.0, models=(ON_RING,)
)


def test_with_every_guard_holding_the_reboot_is_allowed():
    assert reboot_refusal(ALLOWED) is None
    down = replace(ON_RING, serving=False, backend=None, healthy_nodes=frozenset())
    assert reboot_refusal(replace(ALLOWED, models=(down,))) is None


@pytest.mark.parametrize(
    ("changed", "guard", "said"),
    [
        ({"allowed": False}, "off", "nodes.ai002.reboot.allowed is false"),
        ({"models": (replace(ON_RING, paused=True),)}, "paused", "a person paused glm"),
        ({"rebooting": {"ai004"}}, "another-rebooting", "ai004 is being rebooted"),
        ({"booted_at": DAY - 600}, "booted-recently", "ai002 booted 600s ago"),
        (
            {"models": (replace(ON_RING, healthy_nodes=frozenset({"ai002"})),)},
            "last-healthy-node",
            "ai002 is the last healthy node of glm, serving",
        ),
        ({"models": (replace(ON_RING, backend="jaccl"),)}, "no-need", "down or on ring"),
        (
            {"models": (replace(ON_RING, survivors_hold_its_domains=False),)},
            "no-need",
            "domains its survivors hold",
        ),
    ],
)
def test_each_refusal_names_its_guard(changed: dict, guard: str, said: str):
    refusal = reboot_refusal(replace(ALLOWED, **changed))
    assert refusal is not None and refusal.guard == guard and said in refusal.why
    assert str(refusal).startswith(f"reboot refused by the {guard} guard: ")


def test_its_own_reboot_in_flight_does_not_refuse_it():
    assert reboot_refusal(replace(ALLOWED, rebooting={"ai002"})) is None
