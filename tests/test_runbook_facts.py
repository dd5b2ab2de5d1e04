"""What on-call reads states only settled facts, or says they are disputed: the commands carry
the sudo they need, the defaults are the code's, and the remediator is described as it is."""

from __future__ import annotations

import argparse
import re
from importlib import metadata
from pathlib import Path

import pytest

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.model_settings import Policy
from mlx_medic.inventory.reference import human_duration
from mlx_medic.remediator.playbooks.recover import RecoverPlaybook

ROOT = Path(__file__).resolve().parents[1]
RUNBOOKS = ROOT / "alerting-rules" / "runbooks"
RULES = ROOT / "alerting-rules" / "mlx-medic.rules.yaml"
DECISIONS = ROOT / "docs" / "decisions.md"
ON_CALL_TEXTS = sorted(
    [
        *RUNBOOKS.glob("*.md"),
        *(ROOT / "docs").glob("*.md"),
        ROOT / "README.md",
        *(ROOT / "deploy").rglob("*"),
        RULES,
        ROOT / "examples" / "inventory.yaml",
    ]
)
# A sudoers file's lines are the rules sudo applies to `sudo -n ...`, not commands shown.
ON_CALL_TEXTS = [p for p in ON_CALL_TEXTS if p.is_file() and "sudoers" not in p.parts]

# launchctl(1): "Anyone may read or query the system domain, but root privileges are required
# to make modifications" (macos-facts.md §1): these subcommands change a job.
LAUNCHCTL_CHANGES = (
    "kickstart",
    "bootout",
    "bootstrap",
    "enable",
    "disable",
    "kill",
    "load",
    "unload",
    "remove",
    "start",
    "stop",
    "submit",
)


def text_of(path: Path) -> str:
    """The text on-call reads: YAML comments without their `#`."""
    text = path.read_text(encoding="utf-8")
    return re.sub(r"^\s*# ?", "", text, flags=re.M) if path.suffix == ".yaml" else text


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, list items apart, whitespace folded."""
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text)
    return [" ".join(block.split()) for block in blocks if block.strip()]


def test_there_are_on_call_texts_to_check():
    names = {p.name for p in ON_CALL_TEXTS}
    assert {"README.md", "decisions.md", "llmmodeldown.md", "com.mlx-medic.exporter.plist"} <= names


@pytest.mark.parametrize("path", ON_CALL_TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_launchctl_command_that_changes_a_job_is_shown_with_sudo(path):
    changes = "|".join(LAUNCHCTL_CHANGES)
    text = text_of(path)
    for match in re.finditer(rf"(?:/bin/)?launchctl\s+(?:{changes})\b", text):
        before = text[max(0, match.start() - 12) : match.start()]
        assert re.search(r"\bsudo (?:-n )?$", before), f"{path.name}: {match[0]!r} without sudo"


def test_the_sudo_check_catches_a_bare_launchctl_bootout(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("stop it with `launchctl bootout system/LABEL` if KeepAlive restarts it\n")
    with pytest.raises(AssertionError, match="without sudo"):
        test_every_launchctl_command_that_changes_a_job_is_shown_with_sudo(page)


def test_a_stated_start_timeout_default_is_the_codes():
    """Wherever on-call reads the default `start_timeout`, it is the one the code has."""
    default = Policy().start_timeout
    minutes = f"{default / 60:g} minutes"
    short = human_duration(default)
    stated = [
        (path.name, block)
        for path in ON_CALL_TEXTS
        for block in paragraphs(text_of(path))
        if "start_timeout" in block and "default" in block
    ]
    assert stated, "no text states start_timeout's default"
    for name, block in stated:
        assert minutes in block or f"{short} by default" in block or f"`{short}`" in block, (
            name,
            block,
        )
        assert "15 minutes" not in block, (name, block)


def server_parser() -> argparse.ArgumentParser:
    """mlx_lm.server's own argument parser, as installed (its main() builds it inline)."""
    server = pytest.importorskip("mlx_lm.server")

    class Built(Exception):
        pass

    def capture(self, *args, **kwargs):
        raise Built(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        server.main()
    except Built as built:
        return built.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError("mlx_lm.server.main() did not parse its arguments")


def test_mlx_lm_servers_prefill_step_default_is_2048_as_the_runbook_says():
    assert metadata.version("mlx-lm").startswith("0.32.")
    assert server_parser().get_default("prefill_step_size") == 2048
    runbook = " ".join(text_of(RUNBOOKS / "mlxmetalgputimeouts.md").split())
    assert "already defaults to 2048 (mlx-lm 0.32" in runbook
    assert "`mlx_lm.server` reads `--prefill-step-size`" in runbook
    assert "own `serve.py`" in runbook  # whose server the seed's 2048 went to
    assert "smaller step" in runbook and "--prefill-step-size 1024" in runbook
    decisions = " ".join(text_of(DECISIONS).split())
    assert "`default=2048`" in decisions


# Where the seeds disagree (docs/decisions.md), on-call reads "disputed", never a verdict.
DISPUTED_CLAIMS = [
    re.compile(r"comes? back when (?:the|its) (?:process|holder)s? exits?", re.I),
    re.compile(r"(?:stuck )?in the JACCL RDMA stack", re.I),
    re.compile(r"leaks? (?:one )?(?:on|at) every teardown", re.I),
    re.compile(r"SIGKILLed[^.]*leak", re.I),
]


def test_the_decisions_page_lists_the_three_questions_the_seeds_disagree_on():
    section = text_of(DECISIONS).split("## What the seeds disagree on", 1)[1].split("\n## ")[0]
    assert "Does a domain come back when its process exits?" in section
    assert "Does a domain leak on every teardown?" in section
    assert "Do uninterruptible (`Us+`) ranks sit in the RDMA stack?" in section


@pytest.mark.parametrize("path", sorted(RUNBOOKS.glob("*.md")), ids=lambda p: p.name)
def test_a_runbook_states_what_the_seeds_disagree_on_only_as_disputed(path):
    for block in paragraphs(text_of(path)):
        if any(claim.search(block) for claim in DISPUTED_CLAIMS):
            assert "disputed" in block, f"{path.name}: {block}"


def test_the_runbooks_that_touch_a_disputed_question_say_so_and_link_the_sources():
    for name in (
        "mlxrdmaprotectiondomainshigh.md",
        "mlxrdmaprotectiondomainsexhausted.md",
        "mlxjacclprotectiondomainerrors.md",
        "mlxorphanprocessesuninterruptible.md",
        "README.md",
    ):
        text = text_of(RUNBOOKS / name)
        assert "disputed" in text and "docs/decisions.md#what-the-seeds-disagree-on" in text


def test_the_decisions_page_puts_the_budget_per_device_and_ioclasscount_per_node():
    section = " ".join(text_of(DECISIONS).split("## What the seeds disagree on")[0].split())
    assert (
        "is a limit of each RDMA device (`rdma_enX`, one per Thunderbolt link), not of the"
        " node" in section
    )
    assert "`ioclasscount` cannot tell devices apart" in section
    # the sources it names: the dryvist measurement, JACCL's code, the man page (as fixtured)
    assert "`max_pd: 11 max_qp: 11 max_cq: 11` on every RDMA device" in section
    assert "`Connection::allocate_protection_domain`" in section
    assert "`MeshGroup::initialize`" in section
    manpage = (ROOT / "tests" / "fixtures" / "macos" / "ioclasscount_manpage.txt").read_text()
    assert "ioclasscount(8)" in manpage and "ioclasscount(8)" in section


# Every page a user reads: a source it cites must be one the reader can open.
READ_DOCS = sorted(
    {*ON_CALL_TEXTS, *ROOT.glob("bench/*/RESULTS.md"), ROOT / "testbed" / "README.md"}
)
# Paths on the machine that wrote the page (the reference notes and seeds were there).
LOCAL_PATH = re.compile(r"/work/\S*|(?<![\w./-])shared/\S*")
# A Markdown link's target: inline `](target)` or a reference definition `[id]: target`.
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s+(\S+)", re.M)


def local_paths(text: str) -> list[str]:
    return LOCAL_PATH.findall(text)


@pytest.mark.parametrize("path", READ_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_document_cites_its_sources_by_public_address_never_by_a_local_path(path):
    assert local_paths(path.read_text(encoding="utf-8")) == [], path.relative_to(ROOT)


def test_the_local_path_check_catches_the_reference_notes_and_the_seeds():
    assert local_paths("(macos-facts.md; `/work/shared/reference/macos-facts.md` §5)")
    assert local_paths("as the seed does it (shared/seeds/000_*)")
    assert not local_paths("[dryvist]: https://github.com/dryvist/nix-ai/blob/develop/docs/")
    assert not local_paths("`mlx_medic/state/shared_dirs.py`, /usr/share/man")


@pytest.mark.parametrize(
    "path", [p for p in READ_DOCS if p.suffix == ".md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_documents_links_into_the_repository_lead_to_files_that_exist(path):
    for inline, reference in LINK_TARGET.findall(path.read_text(encoding="utf-8")):
        target = (inline or reference).split("#", 1)[0]
        if target and ":" not in target:  # an address (https:, mailto:) or an anchor alone
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)}: {target}"


def test_the_decisions_page_links_its_sources():
    text = text_of(DECISIONS)
    for address in (
        "https://valensas.com/blog/how-we-fixed-a-silent-killer-in-our-mac-studio-llm-cluster",
        "https://github.com/dryvist/nix-ai/blob/develop/docs/runbooks/rdma-protection-domains.md",
        "https://github.com/ml-explore/mlx/pull/4530",
        "https://github.com/exo-explore/exo/pull/2205",
        "https://keith.github.io/xcode-man-pages/ioclasscount.8.html",
    ):
        assert address in text


def test_the_protection_domain_runbooks_and_rules_count_per_rdma_device():
    for name in (
        "mlxrdmaprotectiondomainshigh.md",
        "mlxrdmaprotectiondomainsexhausted.md",
        "mlxorphanprocesses.md",
        "README.md",
    ):
        assert re.search(r"11 per (?:RDMA )?device", " ".join(text_of(RUNBOOKS / name).split()))
    rules = text_of(RULES)
    assert "10 * count by (node) (count by (node, device) (mlx_rdma_port_active))" in rules
    assert "budget is 11 per RDMA device" in " ".join(rules.split())
    assert "docs/decisions.md" in rules


def recover_step_names(kind: str = "wrapper") -> list[str]:
    """The recover playbook's steps, in order, for the example inventory's first model."""
    inventory = load_inventory(ROOT / "examples" / "inventory.yaml")
    model = inventory.models[0]
    model = model.model_copy(update={"service": model.service.model_copy(update={"kind": kind})})
    return [step.describe().name for step in RecoverPlaybook().plan(model, inventory)]


NOT_TODAY = re.compile(r"not implemented yet|planned, not implemented|acts? on no node", re.I)


def test_the_runbooks_name_every_step_recover_takes_in_its_order():
    readme = " ".join(text_of(RUNBOOKS / "README.md").split())
    section = readme[
        readme.index("## What the remediator does today") : readme.index(
            "## Recover a model by hand"
        )
    ]
    names = recover_step_names()
    assert names == [
        "preflight",
        "stop-service",
        "sweep",
        "clean-tmp",
        "start-service",
        "verify",
        "pin-ring",
        "restart-service",
        "verify-ring",
        "escalate",
    ]
    positions = [section.index(f"`{name}`") for name in names]
    assert positions == sorted(positions)
    for helper in (
        "node facts",
        "node service MODEL stop",
        "node sweep MODEL",
        "node clean MODEL",
        "node service MODEL start",
        "node backend MODEL set ring",
    ):
        assert f"`{helper}" in section, helper
    assert "pin-ring" not in recover_step_names("script")
    assert "a backend pin changes nothing there" in section


def test_no_runbook_says_the_remediator_acts_on_no_node():
    for path in [*sorted(RUNBOOKS.glob("*.md")), ROOT / "README.md"]:
        for block in paragraphs(text_of(path)):
            assert not NOT_TODAY.search(" ".join(block.split())), f"{path.name}: {block}"
