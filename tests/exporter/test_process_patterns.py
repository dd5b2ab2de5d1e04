"""A model's process patterns: the seed's own `serve.py` ranks and `mlx-share-rank.py`
share ranks are the model's, with their roles, by an anchored match the inventory
validates; the exporter uses them on a real scrape."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.platform.proc_linux import LinuxProcessTable
from mlx_medic.processes.command_line import command_text
from mlx_medic.processes.info import Role
from mlx_medic.processes.roles import PatternSet, classifier, classify
from mlx_medic.processes.scope import ModelScoper
from tests.exporter.process_tables import FakeProc, proc, ssh_client_argv

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/opt/homebrew/bin/python3"
SHARE_DIR = "/Users/ai/.cache/mlx-share/glm-4_6-5b"


def seed_inventory(patterns: str) -> str:
    """The seed's glm model, with `patterns` as its process_patterns block."""
    return f"""\
nodes:
  ai001: {{ssh: 192.168.101.1}}
  ai002: {{ssh: 192.168.101.2}}
models:
  glm-4_6-5b:
    model: mlx-community/GLM-4.6-5bit
    nodes: [ai001, ai002]
    port: 8080
    service: {{manager: launchd, label: com.valensas.vale.glm-4_6-5b}}
    backends: {{jaccl: {{hostfile: /etc/mlx-medic/glm.jaccl.json}}}}
    process_patterns:
{textwrap.indent(patterns, "      ")}
"""


# The seed's two sweeps (`pgrep -f "serve\.py .*--port $port"`,
# `pgrep -f "mlx-share-rank.py.*--tmpdir ${tmpdir}"`) as anchored patterns.
SEED_PATTERNS = rf"""rank: ['serve\.py --model \S+ --port 8080( .*)?']
share: ['mlx-share-rank\.py .*--tmpdir {SHARE_DIR}( .*)?']
"""
INVENTORY = parse_inventory(seed_inventory(SEED_PATTERNS))
PATTERNS = PatternSet.of(INVENTORY)

SERVE = [
    PYTHON,
    "/opt/seed/serve.py",
    "--model",
    "mlx-community/GLM-4.6-5bit",
    "--port",
    "8080",
    "--prefill-step-size",
    "2048",
]
SHARE_RANK = [
    PYTHON,
    "/opt/seed/mlx-share-rank.py",
    "--model",
    "mlx-community/GLM-4.6-5bit",
    "--tmpdir",
    SHARE_DIR,
]


def role(argv, env=None, patterns=PATTERNS):
    return classify(argv, lambda: env or {}, patterns)


def test_the_command_text_is_what_runs_and_its_arguments_never_the_interpreter():
    assert command_text(SERVE) == (
        "serve.py --model mlx-community/GLM-4.6-5bit --port 8080 --prefill-step-size 2048"
    )
    assert (
        command_text(["/usr/bin/python3", "-u", "-m", "mlx_lm", "server", "--port", "1"])
        == "mlx_lm server --port 1"
    )
    assert command_text(["/usr/local/bin/serve.py", "--port", "1"]) == "serve.py --port 1"
    assert command_text([PYTHON, "-c", "import serve"]) is None


def test_the_seeds_ranks_are_found_by_the_models_patterns_with_or_without_mlx_rank():
    assert role(SERVE) is Role.RANK  # environment unreadable (another user, no root)
    assert role(SERVE, {"MLX_RANK": "1"}) is Role.RANK
    assert role(SERVE) is Role.RANK and role(SERVE, patterns=PatternSet()) is None


def test_the_seeds_share_rank_is_a_share_not_a_rank():
    assert role(SHARE_RANK, {"MLX_RANK": "2"}) is Role.SHARE
    assert role(SHARE_RANK, {"MLX_RANK": "2"}, patterns=PatternSet()) is Role.RANK  # before


@pytest.mark.parametrize(
    "argv",
    [
        ["grep", "serve.py --model x --port 8080"],
        ["/bin/bash", "-c", "python3 serve.py --model x --port 8080"],
        ["vim", "serve.py"],
        [PYTHON, "/opt/seed/serve.py.bak", "--model", "x", "--port", "8080"],
        [PYTHON, "/opt/seed/serve.py", "--model", "x", "--port", "80801"],
        [PYTHON, "-c", "serve.py --model x --port 8080"],
        [PYTHON, "/opt/seed/mlx-share-rank.py", "--tmpdir", SHARE_DIR + "-other"],
    ],
)
def test_a_pattern_must_match_the_whole_command_text(argv):
    assert role(argv) is None


ANY_ORDER = r"serve\.py(?=.* --model \S+( |$))(?=.* --port 8080( |$))( .*)?"


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "m", "--port", "8080"],
        ["--port", "8080", "--host", "0.0.0.0", "--model", "m"],
        ["--host", "0.0.0.0", "--model", "m", "--port", "8080", "--pipeline"],
    ],
)
def test_a_pattern_written_with_lookaheads_matches_whatever_the_order_of_the_arguments(args):
    patterns = PatternSet.of(parse_inventory(seed_inventory(f"rank: ['{ANY_ORDER}']")))
    assert role([PYTHON, "/opt/seed/serve.py", *args], patterns=patterns) is Role.RANK
    # ... and still only the whole command text of the model's own port
    wrong = [a if a != "8080" else "80801" for a in args]
    assert role([PYTHON, "/opt/seed/serve.py", *wrong], patterns=patterns) is None


def test_a_pattern_puts_the_process_and_the_ssh_client_that_starts_it_in_the_models_scope():
    processes = [
        proc(10, 1, SERVE),
        proc(11, 1, SHARE_RANK, env={"MLX_RANK": "1"}),
        proc(12, 1, ssh_client_argv("192.168.101.2", 1, SERVE)),
    ]
    for process in processes:
        process.role = role(process.cmdline, process.env)
    assert [p.role for p in processes] == [Role.RANK, Role.SHARE, Role.SSH_CLIENT]
    scoper = ModelScoper(INVENTORY)
    assert [scoper.model_of(p) for p in processes] == ["glm-4_6-5b"] * 3
    # Without the patterns: no port of the model, no tmp dir, so by the --model path alone.
    assert (
        ModelScoper(parse_inventory(seed_inventory("rank: []\n"))).model_of(
            proc(13, 1, [*SHARE_RANK[:2], "--tmpdir", SHARE_DIR])
        )
        is None
    )


def test_the_linux_table_finds_a_serve_py_whose_environment_it_cannot_read(tmp_path: Path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/launchd"])
    entry = fake.add(10, 1, SERVE)
    (entry / "environ").unlink()  # another user's process: no MLX_RANK to see
    assert LinuxProcessTable(proc_root=fake.root).snapshot() == []
    found = LinuxProcessTable(proc_root=fake.root, classifier=classifier(PATTERNS)).snapshot()
    assert [(p.pid, p.role) for p in found if p.role] == [(10, Role.RANK)]


# --- validation ---------------------------------------------------------------------


def problems(patterns: str) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(seed_inventory(patterns), "inv.yaml")
    return caught.value.problems


def test_a_pattern_that_is_not_a_regular_expression_is_refused_with_its_line_and_field():
    assert problems("rank: ['serve\\.py (']\n") == [
        "line 12, column 14: models.glm-4_6-5b.process_patterns.rank[0]: 'serve\\.py (':"
        " not a regular expression:"
        " missing ), unterminated subpattern at position 10"
    ]


@pytest.mark.parametrize(
    "pattern,matched",
    [
        (".*", "bash"),
        (".*serve\\.py.*", "grep serve.py"),
        ("(ba)?sh.*", "bash"),
    ],
)
def test_a_pattern_that_would_take_shells_or_grep_into_the_models_scope_is_refused(
    pattern, matched
):
    (problem,) = problems(f"share:\n  - '{pattern}'\n")
    assert problem.startswith(
        f"line 13, column 11: models.glm-4_6-5b.process_patterns.share[0]: '{pattern}':"
        f" too broad: it matches `{matched}`"
    )


def test_process_patterns_know_only_the_rank_and_share_roles():
    assert problems("launcher: ['mlx\\.launch .*']\n") == [
        "line 12, column 7: models.glm-4_6-5b.process_patterns.launcher:"
        " unknown field (check the spelling)"
    ]


# --- the exporter, for real ---------------------------------------------------------------


def test_a_scrape_counts_the_seeds_serve_py_and_share_rank_by_their_roles(tmp_path: Path):
    """Real processes named as the seed's, one without MLX_RANK: the exporter finds both
    through the inventory's patterns, the share rank as `share`."""
    token = uuid.uuid4().hex[:8]
    share_dir = tmp_path / f"share-{token}"
    scripts = tmp_path / "seed"
    scripts.mkdir()
    for name in ("serve.py", "mlx-share-rank.py"):
        (scripts / name).write_text("import time\ntime.sleep(120)\n")
    port = 20000 + int(token[:4], 16) % 20000
    patterns = (
        f"rank: ['serve\\.py --model \\S+ --port {port}( .*)?']\n"
        f"share: ['mlx-share-rank\\.py .*--tmpdir {share_dir}( .*)?']\n"
    )
    text = seed_inventory(patterns).replace("port: 8080", f"port: {port}")
    text += f"state_dir: {tmp_path / 'state'}\n"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(text)
    started = [
        subprocess.Popen(
            [sys.executable, str(scripts / "serve.py"), "--model", "m", "--port", str(port)],
            env={**os.environ},
        ),
        subprocess.Popen(
            [sys.executable, str(scripts / "mlx-share-rank.py"), "--tmpdir", str(share_dir)],
            env={**os.environ, "MLX_RANK": "1"},
        ),
    ]
    try:
        scrape = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_medic.cli",
                "exporter",
                "--once",
                "--inventory",
                str(inventory),
                "--node",
                "ai001",
                "--no-collector.service",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert scrape.returncode == 0, scrape.stderr
    lines = scrape.stdout.splitlines()
    for role_ in ("rank", "share"):
        assert (
            f'mlx_processes{{model="glm-4_6-5b",node="ai001",role="{role_}",state="sleeping"}} 1.0'
        ) in lines


def test_check_config_points_the_seeds_extra_params_at_serve_args(tmp_path: Path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        seed_inventory("rank: []\n") + "    extra_params:\n      prefill-step-size: 2048\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "check-config", str(inventory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        "line 14, column 5: models.glm-4_6-5b.extra_params: unknown field: mlx-medic calls it"
        " `serve_args` (the seed's `extra_params`: the same flags without dashes, e.g."
        " `serve_args: {prefill-step-size: 2048}`)"
    ) in result.stderr


def test_the_inventory_reference_tells_how_a_pattern_matches_as_the_code_does():
    import re

    text = (REPO / "docs" / "inventory.md").read_text()
    section = text.split("## Process patterns", 1)[1].split("\n## ", 1)[0]
    words = " ".join(section.split())
    command = (
        "python3 /opt/seed/serve.py --model mlx-community/GLM-4.6-5bit --port 8080"
        " --prefill-step-size 2048"
    )
    said = (
        "has the command text `serve.py --model mlx-community/GLM-4.6-5bit --port 8080"
        " --prefill-step-size 2048`, which `serve\\.py --model \\S+ --port 8080( .*)?`"
        " matches and `serve\\.py --model \\S+ --port 80` does not"
    )
    assert command in words and said in words
    assert (
        command_text(command.split())
        == "serve.py --model mlx-community/GLM-4.6-5bit --port 8080 --prefill-step-size 2048"
    )
    assert re.fullmatch(r"serve\.py --model \S+ --port 8080( .*)?", command_text(command.split()))
    assert not re.fullmatch(r"serve\.py --model \S+ --port 80", command_text(command.split()))
    assert "`extra_params` is answered with the field that means it: `serve_args`" in " ".join(
        text.split()
    )
