"""What a user installs: a wheel built from a clean export of the repository holds one import
package, `mlx_medic`, and its commands work from an empty venv outside the repository.

The same checks run as `.venv/bin/python scripts/wheel_proof.py`.
"""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from scripts import wheel_proof
from scripts.wheel_proof import Installed, ProofFailed


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return wheel_proof.prove(tmp_path_factory.mktemp("wheel-proof"))


@pytest.mark.slow
def test_the_wheel_holds_one_import_package(installed: Installed) -> None:
    wheel_proof.check_one_import_package(installed.wheel)


@pytest.mark.slow
def test_the_linked_exporter_and_remediator_ship_as_real_files(installed: Installed) -> None:
    wheel_proof.check_linked_subpackages_are_real_files(installed.wheel)


@pytest.mark.slow
def test_every_module_and_package_data_file_ships(installed: Installed) -> None:
    wheel_proof.check_every_package_file_ships(installed.wheel)


@pytest.mark.slow
def test_installed_help_works_outside_the_repository(installed: Installed) -> None:
    wheel_proof.check_help(installed)


@pytest.mark.slow
def test_installed_exporter_scrapes_once_with_embedded_defaults(installed: Installed) -> None:
    wheel_proof.check_exporter_once(installed)


@pytest.mark.slow
def test_installed_remediator_imports_from_the_venv_and_its_help_works(
    installed: Installed,
) -> None:
    wheel_proof.check_remediator_imports_from_the_install(installed)
    wheel_proof.check_remediator_help(installed)


@pytest.mark.slow
def test_installed_render_rules_writes_the_shipped_rules_without_a_checkout(
    installed: Installed,
) -> None:
    wheel_proof.check_render_rules(installed)


@pytest.mark.slow
def test_installed_dependencies_are_consistent(installed: Installed) -> None:
    wheel_proof.check_dependencies_consistent(installed)


# --- the checks have teeth: hand-made wheels that each must fail ----------------------


def make_wheel(path: Path, names: list[str], links: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "mlx_medic\n" if name.endswith("top_level.txt") else "")
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "../exporter")
    return path


DIST_INFO = ["mlx_medic-0.1.0.dist-info/METADATA", "mlx_medic-0.1.0.dist-info/top_level.txt"]


def test_a_wheel_with_a_top_level_exporter_package_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "w.whl", ["mlx_medic/__init__.py", "exporter/__init__.py", *DIST_INFO]
    )
    with pytest.raises(ProofFailed, match="expected only mlx_medic/"):
        wheel_proof.check_one_import_package(wheel)


def test_a_wheel_holding_the_link_instead_of_the_files_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "w.whl", ["mlx_medic/__init__.py", *DIST_INFO], links=("mlx_medic/exporter",)
    )
    with pytest.raises(ProofFailed, match="symlinks in the wheel"):
        wheel_proof.check_linked_subpackages_are_real_files(wheel)


def test_a_wheel_missing_a_tracked_package_file_is_refused(tmp_path: Path) -> None:
    shipped = sorted(wheel_proof.package_files() - {"mlx_medic/remediator/engine.py"})
    wheel = make_wheel(tmp_path / "w.whl", [*shipped, *DIST_INFO])
    with pytest.raises(ProofFailed, match=r"missing from the wheel .*remediator/engine\.py"):
        wheel_proof.check_every_package_file_ships(wheel)


def test_the_package_files_follow_the_links_into_the_visible_folders() -> None:
    files = wheel_proof.package_files()
    assert "mlx_medic/exporter/main.py" in files and "mlx_medic/remediator/engine.py" in files
    assert not any(name.startswith(("exporter/", "remediator/")) for name in files)
