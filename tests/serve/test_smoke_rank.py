"""The smoke test's rank program records what a JACCL attempt cost on its own node: a
failed start is a protection domain spent; a clean init and teardown is a disputed cycle,
never debt. (mlx[cpu] on Linux cannot initialise JACCL, so the backend's init is replaced
here; the real failure is in tests/serve/test_serve_testbed.py.)"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from mlx_medic.serve import smoke
from mlx_medic.state.ledger import read_ledger
from mlx_medic.state.node_identity import write_node_id


class OneRank:
    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def run_smoke(tmp_path: Path, backend: str) -> int:
    write_node_id(tmp_path, "ai002")
    return smoke.main(["--backend", backend, "--state-dir", str(tmp_path), "--model", "tiny"])


def test_a_failed_jaccl_init_is_recorded_as_a_disputed_cycle_not_debt(
    tmp_path: Path, monkeypatch, capsys
):
    def refuse(**_: object) -> None:
        raise RuntimeError("Cannot initialize jaccl distributed backend.")

    monkeypatch.setattr(mx.distributed, "init", refuse)
    assert run_smoke(tmp_path, "jaccl") == 1
    assert (
        "mlx-medic smoke: rank ? failed: RuntimeError: Cannot initialize jaccl"
        in capsys.readouterr().out
    )
    ledger = read_ledger(tmp_path, "ai002")
    assert [(e.kind, e.model) for e in ledger.entries] == [("failed_start", "tiny")]
    assert (ledger.debt, ledger.disputed_cycles) == (0, 1)  # a failed allocation spends nothing


def test_a_clean_jaccl_init_and_teardown_is_a_disputed_cycle_not_debt(
    tmp_path: Path, monkeypatch, capsys
):
    monkeypatch.setattr(mx.distributed, "init", lambda **_: OneRank())
    monkeypatch.setattr(mx.distributed, "all_sum", lambda x, group=None: x)
    assert run_smoke(tmp_path, "jaccl") == 0
    assert "mlx-medic smoke: rank 0 of 1 ok sum=1" in capsys.readouterr().out
    ledger = read_ledger(tmp_path, "ai002")
    assert [e.kind for e in ledger.entries] == ["init_teardown"]
    assert (ledger.debt, ledger.disputed_cycles) == (0, 1)


@pytest.mark.parametrize("outcome", ["fails", "succeeds"])
def test_a_ring_smoke_test_spends_nothing(tmp_path: Path, monkeypatch, outcome: str):
    def refuse(**_: object) -> None:
        raise RuntimeError("no ring")

    init = refuse if outcome == "fails" else (lambda **_: OneRank())
    monkeypatch.setattr(mx.distributed, "init", init)
    monkeypatch.setattr(mx.distributed, "all_sum", lambda x, group=None: x)
    run_smoke(tmp_path, "ring")
    assert read_ledger(tmp_path, "ai002").entries == []
