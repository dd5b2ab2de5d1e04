"""deploy/ is the rendered output of examples/inventory.yaml: rendering again gives the
same files, byte for byte (regenerate with scripts/render-deploy.sh)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.render.helpers import REPO, run

DEPLOY = REPO / "deploy"
WRITTEN_BY_HAND = {"remediator.yml"}  # the remediator's config, not rendered


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and str(p.relative_to(root)) not in WRITTEN_BY_HAND
    }


def test_deploy_is_exactly_what_render_makes_of_the_example_inventory(tmp_path: Path):
    result = run(
        str(REPO / "scripts" / "render-deploy.sh"),
        str(tmp_path / "out"),
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    rendered, shipped = files(tmp_path / "out"), files(DEPLOY)
    assert sorted(rendered) == sorted(shipped), "run scripts/render-deploy.sh"
    stale = [name for name in rendered if rendered[name] != shipped[name]]
    assert not stale, f"{stale} differ from a fresh render: run scripts/render-deploy.sh"
