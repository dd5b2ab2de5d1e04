"""A test's or a staging site's short loop comes from the renderer's own overrides: the
scrape and evaluation interval, the routes' group timings and on-call's webhook. Without
them the shipped defaults stay; bad durations are refused naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlx_medic.command_line import EXIT_USAGE
from tests.render.helpers import EXAMPLE, SITE_FLAGS, render, render_example


def prometheus(out: Path) -> dict:
    return yaml.safe_load((out / "prometheus.yml").read_text())


def alertmanager(out: Path) -> dict:
    return yaml.safe_load((out / "alertmanager.yml").read_text())


def every_route(config: dict) -> list[dict]:
    return [config["route"], *config["route"]["routes"]]


def test_without_overrides_prometheus_scrapes_every_15s_and_the_routes_keep_their_timings(
    tmp_path: Path,
):
    out = render_example("all", tmp_path / "out")
    assert prometheus(out)["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    config = alertmanager(out)
    assert (config["route"]["group_wait"], config["route"]["group_interval"]) == ("30s", "5m")
    assert {
        (r["group_wait"], r["group_interval"])
        for r in config["route"]["routes"]
        if r["receiver"] == "mlx-medic"
    } == {("10s", "1m")}
    oncall = next(r for r in config["receivers"] if r["name"] == "oncall")
    assert oncall["webhook_configs"][0]["url"] == "https://oncall.example/alertmanager"


def test_the_overrides_shorten_the_loop_and_point_on_call_at_a_sink(tmp_path: Path):
    out = render_example(
        "all",
        tmp_path / "out",
        "--prometheus.interval",
        "1s",
        "--alertmanager.group-wait",
        "1s",
        "--alertmanager.group-interval",
        "2s",
        "--alertmanager.oncall-url",
        "http://127.0.0.1:9/oncall",
    )
    assert prometheus(out)["global"] == {
        "scrape_interval": "1s",
        "evaluation_interval": "1s",
        "scrape_timeout": "1s",
    }
    config = alertmanager(out)
    assert {
        (r["group_wait"], r["group_interval"])
        for r in every_route(config)
        if "receiver" in r and "group_wait" in r
    } == {("1s", "2s")}
    oncall = next(r for r in config["receivers"] if r["name"] == "oncall")
    assert oncall["webhook_configs"][0]["url"] == "http://127.0.0.1:9/oncall"
    assert "On-call: http://127.0.0.1:9/oncall." in (out / "alertmanager.yml").read_text()


def test_each_node_s_exporter_listens_on_the_address_prometheus_scrapes(tmp_path: Path):
    out = render_example("all", tmp_path / "out")
    targets = prometheus(out)["scrape_configs"][0]["static_configs"][0]["targets"]
    units = {
        path.parent.name: path.read_text()
        for path in (out / "systemd").glob("*/mlx-medic-exporter.service")
    }
    assert units and len(targets) == len(units)
    for target in targets:
        assert any(f"--web.listen-address {target}" in unit for unit in units.values()), target
    assert not any("0.0.0.0" in unit for unit in units.values())


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--prometheus.interval", "1"], "--prometheus.interval"),
        (["--alertmanager.group-wait", "soon"], "--alertmanager.group-wait"),
        (["--alertmanager.group-interval", "2 s"], "--alertmanager.group-interval"),
    ],
)
def test_a_bad_duration_is_refused_naming_its_flag_and_nothing_is_written(
    tmp_path: Path,
    flags: list[str],
    named: str,
):
    out = tmp_path / "out"
    code, _, err = render(
        "all",
        EXAMPLE,
        out,
        *SITE_FLAGS,
        "--ssh.public-key",
        str(EXAMPLE.parent / "remediator_ed25519.pub"),
        *flags,
    )
    assert code == EXIT_USAGE
    assert named in err and "not a Prometheus duration" in err
    assert not out.exists() or not any(out.iterdir())
