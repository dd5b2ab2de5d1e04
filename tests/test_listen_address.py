"""Listen addresses: the same parsing and the same errors for every service."""

import pytest

from mlx_medic.listen_address import parse_listen


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:10900", ("127.0.0.1", 10900)),
        ("[::1]:10901", ("::1", 10901)),
        (":10900", ("0.0.0.0", 10900)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_host_and_port_are_split(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen(address) == expected


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("10900", "must be HOST:PORT"),
        ("host:http", "'http' is not a port"),
        ("host:70000", "out of range"),
    ],
)
def test_a_bad_address_is_named_with_the_problem(address: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        parse_listen(address)
    assert repr(address) in str(caught.value)
