"""The rule files for Prometheus: the shipped file as it is, or with `for:` and evaluation
intervals overridden, so a test shortens them without editing alerting-rules/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlx_medic.command_line import EXIT_USAGE
from tests.render.helpers import EXAMPLE, REPO, render, render_example, run
from tests.tools import require_tool

SHIPPED = REPO / "alerting-rules" / "mlx-medic.rules.yaml"
DOWN = (
    "LLM model m is down on ai001: its port is not listening or a real request did not"
    " succeed within the probe timeout."
)
RUNBOOK = "https://github.com/mlx-medic/mlx-medic/blob/main/alerting-rules/runbooks/llmmodeldown.md"


def alerts(path: Path) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text())
    return {r["alert"]: r for g in data["groups"] for r in g["rules"] if "alert" in r}


def test_without_overrides_the_shipped_file_is_copied_as_it_is(tmp_path: Path):
    out = render_example("rules", tmp_path)
    assert (out / "rules" / SHIPPED.name).read_text() == SHIPPED.read_text()


def test_a_shortened_for_and_interval_fire_in_promtool_where_the_shipped_rule_would_not(
    tmp_path: Path,
):
    out = render_example(
        "rules", tmp_path / "out", "--rules.for", "LLMModelDown=30s", "--rules.interval", "10s"
    )
    rendered = out / "rules" / SHIPPED.name
    shortened, shipped = alerts(rendered), alerts(SHIPPED)
    assert shortened["LLMModelDown"]["for"] == "30s"
    assert {k: v for k, v in shortened.items() if k != "LLMModelDown"} == {
        k: v for k, v in shipped.items() if k != "LLMModelDown"
    }
    groups = yaml.safe_load(rendered.read_text())["groups"]
    assert {g["interval"] for g in groups} == {"10s"}
    promtool = require_tool("promtool")
    assert run(promtool, "check", "rules", str(rendered)).returncode == 0
    case = {
        "rule_files": [str(rendered)],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "10s",
                "input_series": [
                    {"series": 'mlx_model_up{model="m", node="ai001"}', "values": "0x12"}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "40s",
                        "alertname": "LLMModelDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "model": "m",
                                    "node": "ai001",
                                },
                                "exp_annotations": {
                                    "summary": "An LLM model is not answering requests.",
                                    "description": DOWN,
                                    "runbook_url": RUNBOOK,
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "shortened.yaml"
    test_file.write_text(yaml.safe_dump(case))
    result = run(promtool, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
    case["rule_files"] = [str(SHIPPED)]  # the shipped 2m: not yet firing at 40s
    test_file.write_text(yaml.safe_dump(case))
    assert run(promtool, "test", "rules", str(test_file)).returncode != 0


def test_the_shipped_held_alerts_warn_after_four_hours_as_the_render_setting_writes_them():
    from mlx_medic.render.rules import HELD_ALERTS, held_expr

    shipped = alerts(SHIPPED)
    for name, series in HELD_ALERTS.items():
        assert shipped[name]["expr"] == held_expr(series, 4 * 3600)


def test_held_for_sets_how_long_a_pause_or_an_open_circuit_stays_on_before_it_warns(
    tmp_path: Path,
):
    from mlx_medic.render.rules import HELD_ALERTS, held_expr

    out = render_example("rules", tmp_path / "out", "--rules.held-for", "1h30m")
    rendered = out / "rules" / SHIPPED.name
    changed, shipped = alerts(rendered), alerts(SHIPPED)
    for name, series in HELD_ALERTS.items():
        assert changed[name]["expr"] == held_expr(series, 5400) == f"time() - ({series} > 0) > 5400"
    others = set(shipped) - set(HELD_ALERTS)
    assert {k: changed[k] for k in others} == {k: shipped[k] for k in others}
    assert "held-for 1h30m" in rendered.read_text().splitlines()[1]
    promtool = require_tool("promtool")
    assert run(promtool, "check", "rules", str(rendered)).returncode == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rules.for", "NoSuchAlert=1m"], "no such alert"),
        (["--rules.for", "LLMModelDown=soon"], "not a Prometheus duration"),
        (["--rules.for", "LLMModelDown"], "write ALERT=DURATION"),
        (["--rules.interval", "5"], "not a Prometheus duration"),
        (["--rules.held-for", "4 hours"], "--rules.held-for: '4 hours' is not a Prometheus"),
        (["--rules.file", "/nonexistent/rules.yaml"], "cannot read"),
    ],
)
def test_a_bad_override_is_an_error_naming_it(tmp_path: Path, flags: list[str], message: str):
    code, _, err = render("rules", EXAMPLE, tmp_path / "out", *flags)
    assert code == EXIT_USAGE and message in err
    assert not (tmp_path / "out").exists()


def test_the_shipped_rules_are_package_data_of_mlx_medic_not_a_file_beside_it():
    """An installed wheel has no alerting-rules/ folder: `render rules` reads its own copy."""
    from importlib.resources import files

    from mlx_medic.render import rules

    package = Path(str(files("mlx_medic")))
    assert Path(str(rules.SOURCE)).absolute().is_relative_to(package)
    assert rules.SOURCE.read_text(encoding="utf-8") == SHIPPED.read_text()
