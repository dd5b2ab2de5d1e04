"""The wheel proof: what a user installs is one import package that works on its own.

Exports the repository's tracked files (the working tree's versions) to a temporary
directory, builds a wheel there, installs it with its dependencies into an empty venv
and, from a directory outside the repository, runs the installed commands. Each check
raises `ProofFailed` with what is wrong; tests/test_packaging.py runs the same checks.

    .venv/bin/python scripts/wheel_proof.py [--keep DIR]

Standard library only, so it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "mlx_medic"
# Visible top-level folders linked into the package (mlx_medic/exporter -> ../exporter).
LINKED = ("exporter", "remediator")


class ProofFailed(AssertionError):
    """One check of the proof did not hold; the message says what was found."""


@dataclass(frozen=True)
class Installed:
    """A wheel installed into its own venv, and a directory outside the repository."""

    wheel: Path
    venv: Path
    outside: Path

    def command(self, name: str) -> Path:
        return self.venv / "bin" / name


def _run(argv: list[str | Path], cwd: Path | None = None, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise ProofFailed(
            f"{' '.join(map(str, argv))} exited {result.returncode}\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def _clean_env() -> dict[str, str]:
    """This environment without anything that would point Python back at the repository."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def export_tracked_files(repo: Path, dest: Path) -> Path:
    """A clean copy: the tracked files only (as the working tree has them), links kept."""
    if shutil.which("git") is None or not (repo / ".git").exists():
        raise ProofFailed(f"{repo} is not a git checkout: nothing says which files are tracked")
    listing = _run(["git", "-C", repo, "ls-files", "-z"])
    for name in filter(None, listing.split("\0")):
        source = repo / name
        if not os.path.lexists(source):
            continue  # deleted in the working tree, not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return dest


def build_wheel(source: Path, out: Path) -> Path:
    """Build the project's wheel only (its dependencies come at install time)."""
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out, source])
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise ProofFailed(f"expected one wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0]


def install_into_empty_venv(wheel: Path, venv: Path, outside: Path) -> Installed:
    """A new venv, then `pip install` of the wheel with every dependency resolved by pip."""
    _run([sys.executable, "-m", "venv", venv])
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel])
    outside.mkdir(parents=True, exist_ok=True)
    return Installed(wheel=wheel, venv=venv, outside=outside)


def prove(workdir: Path, repo: Path = REPO) -> Installed:
    """Export, build and install under `workdir`."""
    source = export_tracked_files(repo, workdir / "export")
    wheel = build_wheel(source, workdir / "dist")
    return install_into_empty_venv(wheel, workdir / "venv", workdir / "elsewhere")


# --- checks on the wheel's file list -------------------------------------------------


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def check_one_import_package(wheel: Path) -> None:
    """Only `mlx_medic/` and the wheel's own .dist-info at the top: no `exporter` or
    `remediator` that another distribution could also claim."""
    tops = {name.split("/", 1)[0] for name in wheel_names(wheel)}
    others = sorted(t for t in tops if t != PACKAGE and not t.endswith(".dist-info"))
    if others or PACKAGE not in tops:
        raise ProofFailed(f"the wheel's top level is {sorted(tops)}; expected only {PACKAGE}/")
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt"))
        declared = archive.read(dist_info).decode().split()
    if declared != [PACKAGE]:
        raise ProofFailed(f"top_level.txt declares {declared}; expected [{PACKAGE!r}]")


def check_linked_subpackages_are_real_files(wheel: Path) -> None:
    """The links are followed at build time: regular files, never symlink entries."""
    with zipfile.ZipFile(wheel) as archive:
        links = [i.filename for i in archive.infolist() if stat.S_ISLNK(i.external_attr >> 16)]
        names = archive.namelist()
    if links:
        raise ProofFailed(f"symlinks in the wheel: {links}")
    for folder in LINKED:
        if f"{PACKAGE}/{folder}/__init__.py" not in names:
            raise ProofFailed(f"{PACKAGE}/{folder}/ is not in the wheel as a package")


def package_files(repo: Path = REPO) -> set[str]:
    """The tracked files of the package tree as the wheel names them (links followed)."""
    listing = _run(["git", "-C", repo, "ls-files", "-z", "--", PACKAGE, *LINKED])
    found: set[str] = set()
    for name in filter(None, listing.split("\0")):
        if name in {f"{PACKAGE}/{folder}" for folder in LINKED}:
            continue  # the link itself; its target's files are listed under their own path
        found.add(f"{PACKAGE}/{name}" if name.split("/", 1)[0] in LINKED else name)
    return found


def check_every_package_file_ships(wheel: Path, repo: Path = REPO) -> None:
    """Modules and package data (pyproject's [tool.setuptools.package-data]) alike: a file
    of the package tree left out of the wheel is a module or page missing on a node."""
    shipped = {n for n in wheel_names(wheel) if not n.split("/", 1)[0].endswith(".dist-info")}
    expected = package_files(repo)
    missing, extra = sorted(expected - shipped), sorted(shipped - expected)
    if missing or extra:
        raise ProofFailed(
            f"missing from the wheel (add to package-data?): {missing}; not tracked: {extra}"
        )


# --- checks on the installed commands, run from outside the repository ---------------


def installed_output(installed: Installed, argv: list[str | Path]) -> str:
    """Run an installed command with cwd outside the repository; its stdout."""
    if installed.outside.resolve().is_relative_to(REPO):
        raise ProofFailed(f"{installed.outside} is inside the repository")
    return _run([installed.command(str(argv[0])), *argv[1:]], cwd=installed.outside, timeout=120)


def check_help(installed: Installed) -> None:
    text = installed_output(installed, ["mlx-medic", "--help"])
    if not text.startswith("usage: mlx-medic") or "exporter" not in text:
        raise ProofFailed(f"mlx-medic --help printed:\n{text}")


def check_exporter_once(installed: Installed) -> None:
    """One scrape with the embedded defaults (no inventory); every collector succeeds."""
    state_dir = installed.outside / "state"
    text = installed_output(
        installed, ["mlx-medic", "exporter", "--once", "--state-dir", state_dir]
    )
    results = re.findall(r'^mlx_medic_collector_success\{collector="(\w+)"\} (\S+)$', text, re.M)
    failed = [name for name, value in results if float(value) != 1.0]
    if not results or failed:
        raise ProofFailed(f"collectors failed: {failed or 'none reported'}\n{text}")


def check_remediator_imports_from_the_install(installed: Installed) -> None:
    code = "import mlx_medic.remediator.engine as engine; print(engine.__file__)"
    location = Path(installed_output(installed, ["python", "-c", code]).strip())
    if not location.is_relative_to(installed.venv):
        raise ProofFailed(f"mlx_medic.remediator.engine came from {location}, not the venv")


def check_remediator_help(installed: Installed) -> None:
    text = installed_output(installed, ["mlx-medic", "remediator", "--help"])
    if "--config.file" not in text:
        raise ProofFailed(f"mlx-medic remediator --help printed:\n{text}")


def check_render_rules(installed: Installed) -> None:
    """`render rules` without --rules.file: the shipped rules are package data."""
    inventory = installed.outside / "inventory.yaml"
    shutil.copy2(REPO / "examples" / "inventory.yaml", inventory)
    out = installed.outside / "rendered"
    installed_output(
        installed, ["mlx-medic", "render", "rules", "--inventory", inventory, "--out", out]
    )
    rendered = out / "rules" / "mlx-medic.rules.yaml"
    shipped = REPO / "alerting-rules" / "mlx-medic.rules.yaml"
    if not rendered.is_file() or rendered.read_bytes() != shipped.read_bytes():
        raise ProofFailed(f"mlx-medic render rules did not write the shipped rules to {rendered}")


def check_dependencies_consistent(installed: Installed) -> None:
    installed_output(installed, ["python", "-m", "pip", "check"])


WHEEL_CHECKS: tuple[Callable[[Path], None], ...] = (
    check_one_import_package,
    check_linked_subpackages_are_real_files,
    check_every_package_file_ships,
)
INSTALLED_CHECKS: tuple[Callable[[Installed], None], ...] = (
    check_help,
    check_exporter_once,
    check_remediator_imports_from_the_install,
    check_remediator_help,
    check_render_rules,
    check_dependencies_consistent,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="mlx-medic-wheel-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        installed = prove(workdir)
        print(f"wheel: {installed.wheel.name}; venv: {installed.venv}")
        failures = 0
        checks: list[tuple[str, Callable[[], None]]] = [
            *((c.__name__, lambda c=c: c(installed.wheel)) for c in WHEEL_CHECKS),
            *((c.__name__, lambda c=c: c(installed)) for c in INSTALLED_CHECKS),
        ]
        for name, check in checks:
            try:
                check()
                print(f"ok    {name}")
            except ProofFailed as exc:
                failures += 1
                print(f"FAIL  {name}: {exc}")
        return 1 if failures else 0
    except ProofFailed as exc:
        print(f"FAIL  {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
