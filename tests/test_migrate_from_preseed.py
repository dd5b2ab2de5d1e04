"""docs/migrate-from-preseed.md: the inventory it gives for the seed's cluster is one
`check-config` accepts, and `render launchd` makes plists launchd can read from it."""

from __future__ import annotations

import plistlib
import re
import sys
from pathlib import Path

from mlx_medic.inventory.load import load_inventory
from tests.render.helpers import EXAMPLE_KEY, SITE_FLAGS, render, run

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "migrate-from-preseed.md"


def guide_inventory(tmp_path: Path) -> Path:
    text = GUIDE.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- BEGIN inventory -->\n```yaml\n(.*?)```\n<!-- END inventory -->", text, re.S
    )
    assert block is not None, "the guide's inventory block is missing"
    path = tmp_path / "inventory.yaml"
    path.write_text(block.group(1), encoding="utf-8")
    return path


def test_the_guides_inventory_passes_check_config_with_preseed_on(tmp_path: Path) -> None:
    inventory = guide_inventory(tmp_path)
    result = run(sys.executable, "-m", "mlx_medic.cli", "check-config", str(inventory))
    assert result.returncode == 0, result.stdout + result.stderr
    models = load_inventory(inventory).models
    assert all(m.serve.preseed.enabled for m in models)
    assert all(m.serve_args == {"prefill-step-size": 2048} for m in models)


def test_its_render_launchd_output_is_plists_that_run_the_serve_wrapper(tmp_path: Path) -> None:
    inventory = guide_inventory(tmp_path)
    code, _, err = render(
        "launchd", inventory, tmp_path / "out", *SITE_FLAGS, "--ssh.public-key", str(EXAMPLE_KEY)
    )
    assert code == 0, err
    plists = {}
    for path in sorted((tmp_path / "out" / "launchd").rglob("*.plist")):
        with path.open("rb") as handle:
            plists[path.stem] = plistlib.load(handle)
    for label in ("com.valensas.vale.glm-4_6-5b", "com.valensas.vale.qwq-32b-8bit"):
        job = plists[label]
        assert job["Label"] == label and job["KeepAlive"]
        assert "serve" in job["ProgramArguments"]
