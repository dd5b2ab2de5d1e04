"""YAML output with a comment header: the configs are data, dumped by PyYAML, so quoting
is always right; the header says where the file came from and how to check it."""

from __future__ import annotations

from typing import Any

import yaml

from mlx_medic.render.files import GENERATED


def dump(data: Any, comment: str) -> str:
    header = "".join(f"# {line}\n" for line in f"{GENERATED}\n{comment}".splitlines())
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)
