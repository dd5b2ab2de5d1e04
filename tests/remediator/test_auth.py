"""Credentials: read from the files Alertmanager's config also points at, compared
in constant time; no credentials means no start, unless explicitly insecure. A read-only
set reads and may not write; rotated files are in force without a restart."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.remediator.auth import (
    Access,
    AuthError,
    Credentials,
    CredentialStore,
    load_credentials,
)
from mlx_medic.remediator.config import (
    FLAG_FOUND_BY,
    AuthConfig,
    ConfigFileError,
    ConfigSource,
    SecretFiles,
    read_config,
)
from tests.remediator.conftest import BASIC_PASSWORD, BASIC_USER, TOKEN, basic, bearer


@pytest.fixture
def both(secrets: dict[str, Path]) -> Credentials:
    return Credentials.load(
        AuthConfig(
            bearer_token_file=secrets["token"],
            basic_username=BASIC_USER,
            basic_password_file=secrets["password"],
        )
    )


def test_the_trailing_newline_of_a_secret_file_is_not_part_of_the_secret(
    both: Credentials,
) -> None:
    assert both.bearer_token == TOKEN.encode()
    assert both.basic_password == BASIC_PASSWORD.encode()


def test_the_right_bearer_token_and_basic_credentials_pass(both: Credentials) -> None:
    assert both.check(bearer()["Authorization"]) is None
    assert both.check(basic()["Authorization"]) is None
    assert both.check("bearer " + TOKEN) is None  # the scheme is case-insensitive


@pytest.mark.parametrize(
    "header, reason",
    [
        (None, "no credentials"),
        ("", "no credentials"),
        ("Bearer wrong", "wrong bearer token"),
        ("Bearer " + TOKEN + "x", "wrong bearer token"),
        ("Bearer", "wrong bearer token"),
        ("Basic " + base64.b64encode(b"alertmanager:nope").decode(), "wrong basic credentials"),
        (
            "Basic " + base64.b64encode(b"mallory:" + BASIC_PASSWORD.encode()).decode(),
            "wrong basic credentials",
        ),
        ("Basic !!!notbase64", "malformed basic credentials"),
        ("Basic " + base64.b64encode(b"no-colon").decode(), "malformed basic credentials"),
        ("Digest abc", "unsupported authorization scheme"),
    ],
)
def test_wrong_or_missing_credentials_are_refused_with_a_reason(
    both: Credentials,
    header: str | None,
    reason: str,
) -> None:
    problem = both.check(header)
    assert problem is not None and problem.startswith(reason)


def test_a_scheme_that_is_not_configured_is_refused(secrets: dict[str, Path]) -> None:
    only_bearer = Credentials.load(AuthConfig(bearer_token_file=secrets["token"]))
    assert only_bearer.check(basic()["Authorization"]) is not None
    assert only_bearer.challenge() == ['Bearer realm="mlx-medic"']


def test_no_credentials_refuse_to_start_without_the_insecure_flag() -> None:
    with pytest.raises(AuthError, match="insecure_no_auth: true or pass --insecure-no-auth"):
        load_credentials(AuthConfig(), insecure_no_auth=False)
    assert load_credentials(AuthConfig(), insecure_no_auth=True) is None


def test_read_only_settings_without_full_credentials_are_refused_even_when_insecure(
    secrets: dict[str, Path],
) -> None:
    read_only = {"bearer_token_file": secrets["token"]}
    for config in (AuthConfig(read_only=read_only), AuthConfig(read_only_open=True)):
        with pytest.raises(AuthError, match="with insecure_no_auth every route is open"):
            load_credentials(config, insecure_no_auth=True)


def test_configured_credentials_win_over_the_insecure_flag(secrets: dict[str, Path]) -> None:
    loaded = load_credentials(AuthConfig(bearer_token_file=secrets["token"]), True)
    assert loaded is not None and loaded.access.full.bearer_token == TOKEN.encode()


def test_an_unreadable_or_empty_secret_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match=r"cannot read the bearer token file .*missing"):
        Credentials.load(AuthConfig(bearer_token_file=tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(AuthError, match=r"basic auth password file .*empty is empty"):
        Credentials.load(AuthConfig(basic_username="u", basic_password_file=empty))


# --- a read-only credential, and reading open to all by choice ------------------------

READER_TOKEN = "reader-token-for-tests"


@pytest.fixture
def with_reader(secrets: dict[str, Path], tmp_path: Path) -> Access:
    reader = tmp_path / "reader.token"
    reader.write_text(READER_TOKEN + "\n")
    return Access.load(
        AuthConfig(
            bearer_token_file=secrets["token"],
            read_only=SecretFiles(bearer_token_file=reader),
        )
    )


def test_the_read_only_credential_reads_but_may_not_write(with_reader: Access) -> None:
    assert with_reader.refusal(bearer(READER_TOKEN)["Authorization"], writes=False) is None
    assert with_reader.refusal(bearer(READER_TOKEN)["Authorization"], writes=True) == (
        403,
        "read-only credentials may not post alerts",
    )


def test_the_full_credential_reads_and_writes(with_reader: Access) -> None:
    for writes in (False, True):
        assert with_reader.refusal(bearer()["Authorization"], writes=writes) is None


def test_anything_else_is_refused_as_unauthenticated(with_reader: Access) -> None:
    for writes in (False, True):
        assert with_reader.refusal("Bearer wrong", writes=writes) == (401, "wrong bearer token")
        assert with_reader.refusal(None, writes=writes) == (401, "no credentials")


def test_a_scheme_only_the_read_only_set_has_is_judged_by_it(
    secrets: dict[str, Path],
) -> None:
    access = Access.load(
        AuthConfig(
            bearer_token_file=secrets["token"],
            read_only=SecretFiles(
                basic_username=BASIC_USER, basic_password_file=secrets["password"]
            ),
        )
    )
    assert access.refusal(basic()["Authorization"], writes=False) is None
    assert access.refusal(basic(password="nope")["Authorization"], writes=False) == (
        401,
        "wrong basic credentials",
    )
    assert access.challenge() == [
        'Bearer realm="mlx-medic"',
        'Basic realm="mlx-medic", charset="UTF-8"',
    ]


def test_open_reading_needs_no_credentials_to_read_and_the_full_ones_to_write(
    secrets: dict[str, Path],
) -> None:
    access = Access.load(AuthConfig(bearer_token_file=secrets["token"], read_only_open=True))
    assert access.refusal(None, writes=False) is None
    assert access.refusal(None, writes=True) == (401, "no credentials")
    assert access.refusal(bearer()["Authorization"], writes=True) is None


@pytest.mark.parametrize(
    "auth, problem",
    [
        (
            {"read_only_open": True, "read_only": {"bearer_token_file": "/r"}},
            "auth: read_only_open: true opens reading to anyone, so read_only credentials"
            " would never be asked for",
        ),
        (
            {"read_only": {"basic_username": "viewer"}},
            "auth.read_only: basic auth needs both basic_username and basic_password_file",
        ),
        ({"read_only": {}}, "auth: read_only names no credentials"),
        ({"read_only": {"bearer_token": "x"}}, "auth.read_only.bearer_token"),
    ],
)
def test_a_bad_read_only_setting_is_a_config_error_naming_the_field(
    tmp_path: Path, auth: dict[str, object], problem: str
) -> None:
    path = tmp_path / "remediator.yml"
    path.write_text(yaml.safe_dump({"auth": {"bearer_token_file": "/t", **auth}}))
    with pytest.raises(ConfigFileError) as error:
        read_config(ConfigSource(path, FLAG_FOUND_BY))
    assert problem in error.value.report()


# --- rotation: the files are read again when they change, or on reload() (SIGHUP) ---------


def rotate(path: Path, secret: str) -> None:
    """As an operator rotates a secret: a new file moved over the old one."""
    new = path.with_suffix(".new")
    new.write_text(secret + "\n")
    os.replace(new, path)


def reload_failures(store: CredentialStore) -> float:
    registry = CollectorRegistry()
    registry.register(store)  # type: ignore[arg-type]
    value = registry.get_sample_value("mlx_medic_credentials_reload_failures_total")
    assert value is not None
    return value


def test_a_rotated_token_is_in_force_at_the_next_request_and_the_old_one_is_refused(
    secrets: dict[str, Path],
) -> None:
    store = CredentialStore(AuthConfig(bearer_token_file=secrets["token"]), check_interval=0)
    rotate(secrets["token"], "rotated-token")
    assert store.current().refusal(bearer()["Authorization"], writes=True) == (
        401,
        "wrong bearer token",
    )
    assert store.current().refusal(bearer("rotated-token")["Authorization"], writes=True) is None


def test_files_are_looked_at_once_per_check_interval_and_reload_reads_them_at_once(
    secrets: dict[str, Path],
) -> None:
    store = CredentialStore(AuthConfig(bearer_token_file=secrets["token"]), check_interval=3600)
    rotate(secrets["token"], "rotated-token")
    assert store.current().full.bearer_token == TOKEN.encode()  # not looked at yet
    assert store.reload("SIGHUP")
    assert store.current().full.bearer_token == b"rotated-token"


def test_a_failed_reload_keeps_the_old_credentials_and_says_why(
    secrets: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    store = CredentialStore(AuthConfig(bearer_token_file=secrets["token"]), check_interval=0)
    secrets["token"].write_text("\n")
    assert store.current().refusal(bearer()["Authorization"], writes=True) is None
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == (
        "credentials not reloaded (a credentials file changed); the old ones stay in force:"
        f" the bearer token file {secrets['token']} is empty"
    )
    assert reload_failures(store) == 1
    store.current()  # an unchanged file is not read again
    assert reload_failures(store) == 1
    secrets["token"].unlink()
    assert not store.reload("SIGHUP") and reload_failures(store) == 2
    rotate(secrets["token"], "fixed")
    assert store.current().full.bearer_token == b"fixed"
