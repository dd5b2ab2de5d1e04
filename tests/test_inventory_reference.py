"""One inventory schema: docs/inventory.md documents every field the models accept, with the
code's type and default, the example inventory sets every section, and check-config accepts
every documented field."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from pydantic import BaseModel, Field, TypeAdapter

from mlx_medic.inventory.load import load_inventory, parse_inventory
from mlx_medic.inventory.model_settings import Policy
from mlx_medic.inventory.reference import (
    REQUIRED,
    SchemaField,
    reference,
    refresh,
    schema_fields,
    schema_models,
    undocumented,
)

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "inventory.md"
EXAMPLE = ROOT / "examples" / "inventory.yaml"
FIELDS = {f.path: f for f in schema_fields()}


def documented_rows(text: str | None = None) -> dict[str, list[str]]:
    """The reference's table as written: field path -> [type, default, meaning]."""
    rows: dict[str, list[str]] = {}
    text = REFERENCE.read_text(encoding="utf-8") if text is None else text
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_field_of_the_models_has_a_description() -> None:
    assert undocumented(FIELDS.values()) == []


def test_the_reference_documents_every_field_of_the_models() -> None:
    missing = sorted(set(FIELDS) - set(documented_rows()))
    assert missing == [], "run: python -m mlx_medic.inventory.reference --write docs/inventory.md"


def test_the_reference_names_no_field_that_does_not_exist() -> None:
    assert sorted(set(documented_rows()) - set(FIELDS)) == []


def documented_default(field: SchemaField, reference_text: str | None = None) -> tuple[bool, Any]:
    """(required?, the documented default read as YAML and validated as the field's value)."""
    text = documented_rows(reference_text)[field.path][1]
    if text == REQUIRED:
        return True, None
    assert text.startswith("`") and text.endswith("`"), f"{field.path}: default {text!r}"
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[field.info.annotation, field.info])
    return False, adapter.validate_python(yaml.safe_load(text.strip("`")))


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_the_documented_default_is_the_code_default(path: str) -> None:
    field = FIELDS[path]
    required, value = documented_default(field)
    assert required == field.info.is_required()
    if not required:
        assert value == field.default()


def test_a_documented_start_timeout_other_than_the_code_default_is_caught() -> None:
    field = FIELDS["models.<name>.policy.start_timeout"]
    assert field.default() == Policy().start_timeout == 600
    edited = REFERENCE.read_text(encoding="utf-8").replace(
        "| `models.<name>.policy.start_timeout` | duration | `10m` |",
        "| `models.<name>.policy.start_timeout` | duration | `15m` |",
    )
    assert documented_default(field) == (False, 600)
    assert documented_default(field, edited) == (False, 900)


def test_the_committed_reference_is_the_generated_one() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    assert refresh(text) == text, (
        "run: python -m mlx_medic.inventory.reference --write docs/inventory.md"
    )


def test_an_undocumented_field_is_found_in_a_nested_section() -> None:
    class Inner(BaseModel):
        documented: int = Field(default=1, description="says what it does")
        reserve: int = 0

    class Root(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="a section")

    assert undocumented(schema_fields(Root)) == ["inner.reserve"]
    assert "| `inner.reserve` | integer | `0` |  |" in reference(Root)


def test_the_example_inventory_sets_every_section() -> None:
    def sections_set(value: object) -> set[type[BaseModel]]:
        if isinstance(value, BaseModel):
            found = {type(value)} if value.model_fields_set else set()
            for name in value.model_fields_set:
                found |= sections_set(getattr(value, name))
            return found
        if isinstance(value, list):
            return set().union(*(sections_set(item) for item in value))
        return set()

    unset = schema_models() - sections_set(load_inventory(EXAMPLE))
    assert sorted(m.__name__ for m in unset) == []


def example_with(path: str, text: str) -> dict[str, Any]:
    """The example inventory's data with the field at `path` set to the YAML `text`
    (`<name>` is the first entry's key, `[]` the first list entry)."""
    data = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))
    parts = path.replace("[]", ".0").split(".")
    node: Any = data
    for part in parts[:-1]:
        key: Any = int(part) if part.isdigit() else (next(iter(node)) if part == "<name>" else part)
        node = node[key]
    node[parts[-1]] = yaml.safe_load(text)
    return data


@pytest.mark.parametrize("path", sorted(p for p, f in FIELDS.items() if not f.info.is_required()))
def test_check_config_accepts_every_documented_field_at_its_documented_default(
    path: str,
) -> None:
    documented = documented_rows()[path][1].strip("`")
    inventory = parse_inventory(yaml.safe_dump(example_with(path, documented), sort_keys=False))
    assert inventory.nodes  # loads with the same models the exporter and remediator use


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_check_config_schema_prints_the_reference_table() -> None:
    result = run_cli("check-config", "--schema")
    assert result.returncode == 0, result.stderr
    assert result.stdout == reference() + "\n"
    assert "| `models.<name>.policy.start_timeout` | duration | `10m` |" in result.stdout


def test_check_config_wants_a_file_or_schema() -> None:
    result = run_cli("check-config")
    assert result.returncode == 2
    assert (
        "one of the arguments file --inventory --config.file --schema is required" in result.stderr
    )


def test_the_generator_reports_a_stale_reference(tmp_path: Path) -> None:
    stale = tmp_path / "inventory.md"
    current = REFERENCE.read_text(encoding="utf-8")
    stale.write_text(current.replace("| `models.<name>.policy.window` |", "| `x` |"))
    command = [sys.executable, "-m", "mlx_medic.inventory.reference"]
    check = subprocess.run([*command, "--check", str(stale)], capture_output=True, text=True)
    assert check.returncode == 1 and "is stale" in check.stderr
    subprocess.run([*command, "--write", str(stale)], check=True)
    assert stale.read_text(encoding="utf-8") == current
