"""Per-collector settings as `--collector.NAME.SETTING` flags, like node_exporter's: the flag
wins, else the environment variable (shortened on purpose in tests, never by accident),
else the default; a bad value is an error that names where it came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from mlx_medic.cli import parse_args
from mlx_medic.exporter.collector import REGISTRY, ExporterContext, ScrapeCollector
from mlx_medic.exporter.collectors.logs import LogsCollector, LogsSettings
from mlx_medic.exporter.collectors.service import ModelServiceCollector, ServiceSettings
from mlx_medic.exporter.collectors.tmpdirs import TmpDirsCollector, TmpDirsSettings
from mlx_medic.exporter.main import build
from mlx_medic.exporter.settings import flag_name, read_settings

VARIABLE = "MLX_MEDIC_TMPDIRS_INTERVAL"


@pytest.fixture
def built() -> Iterator[list[ScrapeCollector]]:
    """Exporters built by a test; their background threads are stopped afterwards."""
    made: list[ScrapeCollector] = []
    yield made
    for scrape in made:
        scrape.close()


def exporter(built: list[ScrapeCollector], *argv: str) -> tuple[ExporterContext, ScrapeCollector]:
    context, scrape = build(parse_args(["exporter", *argv]))
    built.append(scrape)
    return context, scrape


def test_unset_means_the_default() -> None:
    assert read_settings(TmpDirsSettings, environ={}).interval == 60.0
    assert read_settings(ServiceSettings, environ={}) == ServiceSettings(30.0, timeout=10.0)


def test_a_variable_counts_when_no_flag_is_given() -> None:
    assert read_settings(TmpDirsSettings, environ={VARIABLE: "0.5"}).interval == 0.5


def test_a_flag_overrides_the_variable_and_the_default(monkeypatch, built) -> None:
    monkeypatch.setenv(VARIABLE, "7")
    monkeypatch.setenv("MLX_MEDIC_SERVICE_INTERVAL", "9")
    context, scrape = exporter(
        built, "--collector.tmpdirs.interval", "5", "--collector.service.timeout=2.5"
    )
    assert context.settings_for(TmpDirsSettings).interval == 5.0
    assert context.settings_for(ServiceSettings) == ServiceSettings(interval=9.0, timeout=2.5)
    by_name = {c.name: c for c in scrape.collectors}
    tmpdirs = by_name["tmpdirs"]
    assert isinstance(tmpdirs, TmpDirsCollector) and tmpdirs.walker.interval == 5.0
    service = by_name["service"]
    assert isinstance(service, ModelServiceCollector)
    assert (service.interval, service.timeout) == (9.0, 2.5)


def test_logs_settings_reach_the_collector(built) -> None:
    _, scrape = exporter(
        built, "--collector.logs.max-read-per-scrape", "0", "--collector.logs.prefilter", "find"
    )
    logs = next(c for c in scrape.collectors if c.name == "logs")
    assert isinstance(logs, LogsCollector)
    assert logs.max_read_per_scrape is None  # 0: no limit
    assert logs.scanner.engine == "find"
    assert LogsSettings().prefilter == "auto"


@pytest.mark.parametrize(
    ("raw", "problem"), [("x", "is not a number of seconds"), ("0", "must be positive")]
)
def test_a_bad_variable_is_an_error_naming_it(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=f"{VARIABLE}='{raw}' {problem}"):
        read_settings(TmpDirsSettings, environ={VARIABLE: raw})


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--collector.tmpdirs.interval", "-1"],
            "--collector.tmpdirs.interval: '-1' must be positive",
        ),
        (
            ["--collector.logs.prefilter", "grep"],
            "--collector.logs.prefilter: 'grep' is not one of auto, hyperscan, find",
        ),
        (
            ["--collector.logs.max-read-per-scrape", "1M"],
            "--collector.logs.max-read-per-scrape: '1M' is not a whole number of bytes",
        ),
    ],
)
def test_a_bad_flag_is_an_error_naming_it(capsys, argv: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["exporter", *argv])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def test_help_lists_every_setting_of_every_collector(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["exporter", "--help"])
    shown = capsys.readouterr().out
    flags = [
        flag_name(name, field.name)
        for name, registration in REGISTRY.items()
        if registration.settings
        for field in dataclasses.fields(registration.settings)
    ]
    assert {
        "--collector.tmpdirs.interval",
        "--collector.service.interval",
        "--collector.service.timeout",
        "--collector.logs.max-read-per-scrape",
    } <= set(flags)
    for flag in flags:
        assert flag in shown
    assert f"${VARIABLE}" in shown  # the fallback is documented where the flag is


def test_a_collector_context_without_parsed_flags_reads_variables_and_defaults(
    monkeypatch,
) -> None:
    monkeypatch.setenv(VARIABLE, "3")
    assert ExporterContext().settings_for(TmpDirsSettings).interval == 3.0
    monkeypatch.delenv(VARIABLE)
    assert ExporterContext().settings_for(TmpDirsSettings).interval == 60.0
