"""Credentials: read from the files Alertmanager's config also points at, compared
in constant time; no credentials means no start, unless explicitly insecure."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from mlx_medic.remediator.auth import AuthError, Credentials, load_credentials
from mlx_medic.remediator.config import AuthConfig
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


def test_configured_credentials_win_over_the_insecure_flag(secrets: dict[str, Path]) -> None:
    loaded = load_credentials(AuthConfig(bearer_token_file=secrets["token"]), True)
    assert loaded is not None and loaded.configured


def test_an_unreadable_or_empty_secret_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match=r"cannot read the bearer token file .*missing"):
        Credentials.load(AuthConfig(bearer_token_file=tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(AuthError, match=r"basic auth password file .*empty is empty"):
        Credentials.load(AuthConfig(basic_username="u", basic_password_file=empty))
