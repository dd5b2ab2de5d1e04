"""Background cycle intervals from the environment: shortened on purpose, never by accident."""

import pytest

from mlx_medic.exporter.background import interval_from_env


def test_unset_means_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLX_MEDIC_TEST_INTERVAL", raising=False)
    assert interval_from_env("MLX_MEDIC_TEST_INTERVAL", 30.0) == 30.0


def test_a_number_of_seconds_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_MEDIC_TEST_INTERVAL", "0.5")
    assert interval_from_env("MLX_MEDIC_TEST_INTERVAL", 30.0) == 0.5


@pytest.mark.parametrize(("raw", "problem"), [("x", "not a number"), ("0", "must be positive")])
def test_a_bad_value_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str, problem: str
) -> None:
    monkeypatch.setenv("MLX_MEDIC_TEST_INTERVAL", raw)
    with pytest.raises(ValueError, match=f"MLX_MEDIC_TEST_INTERVAL='{raw}' .*{problem}"):
        interval_from_env("MLX_MEDIC_TEST_INTERVAL", 30.0)
