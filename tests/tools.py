"""Test helpers shared by every area."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    """The tool's path. Missing: a failure under CI (it must be installed), else a skip."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (scripts/setup.sh --test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("these tests need root (namespaces, cgroups)")
        pytest.skip("needs root")


THREE_USERS_ENV = "MLX_MEDIC_TESTBED_USERS"


def three_users() -> bool:
    """The three-user mode (testbed/node_users.py): `MLX_MEDIC_TESTBED_USERS=three`."""
    value = os.environ.get(THREE_USERS_ENV, "")
    if value not in ("", "root", "three"):
        raise pytest.UsageError(f"{THREE_USERS_ENV}={value!r}: expected 'three' or 'root'")
    return value == "three"
