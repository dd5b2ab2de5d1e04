"""The client of a helper session (mlx_medic.transport.helper_session): a call through it
answers as the same call run as its own process, calls share it at once, a timeout is a
timeout, and a session that cannot run a call says whether it ran."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mlx_medic.inventory.schema import Node
from mlx_medic.transport import LocalTransport, TransportError
from mlx_medic.transport.helper_session import (
    HelperSession,
    SessionRetry,
    SessionUnavailable,
    session_argv,
    through_a_session,
)
from tests.node.inventories import MEDIC, two_models
from tests.node.test_helper_session import FAKE_SESSION


@contextlib.asynccontextmanager
async def open_session(argv: list[str], timeout: float = 30) -> AsyncIterator[HelperSession]:
    """A session process on this machine, its client, and its end: killed and reaped."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin and process.stdout and process.stderr
    session = HelperSession("n1", process.stdin, process.stdout, process.stderr, process.kill)
    try:
        await session.start(timeout)
        yield session
    finally:
        session.close()
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[HelperSession]:
    stamp = tmp_path / "code-stamp"
    stamp.write_text("v1")
    async with open_session([sys.executable, "-c", FAKE_SESSION, str(stamp)]) as session:
        yield session


@pytest.fixture
def node(tmp_path: Path) -> Node:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(two_models(str(tmp_path / "state")))
    return Node(name="n1", ssh="127.0.0.2", medic_command=MEDIC, medic_config=inventory)


async def test_a_call_answers_as_the_same_call_run_as_its_own_process(node: Node) -> None:
    async with open_session(session_argv(node)) as session:
        for words in (["run", "m1", "show"], ["lock", "m1", "show"], ["run", "m9", "show"]):
            argv = [MEDIC, "node", *words, "--inventory", str(node.medic_config), "--node", "n1"]
            argv.append("--json")
            assert through_a_session(node, argv)
            alone = await LocalTransport().run(node, argv, timeout=60)
            assert await session.run(argv, timeout=60) == alone


async def test_calls_share_one_session_at_once_each_with_its_own_reply(
    fake: HelperSession,
) -> None:
    results = await asyncio.gather(*(fake.run(["exit", str(n)], timeout=30) for n in range(6)))
    assert [result.exit_status for result in results] == list(range(6))


async def test_a_call_past_its_timeout_is_timed_out_and_the_session_serves_on(
    fake: HelperSession,
) -> None:
    late = await fake.run(["sleep", "2"], timeout=0.2)
    assert late.timed_out and late.exit_status is None
    assert (await fake.run(["exit", "0"], timeout=30)).ok


async def test_a_call_mlx_medic_changed_under_is_sent_back_unrun_and_the_session_closed(
    fake: HelperSession, tmp_path: Path
) -> None:
    (tmp_path / "code-stamp").unlink()
    (tmp_path / "code-stamp").write_text("v2")
    with pytest.raises(SessionRetry, match="mlx-medic changed on this node"):
        await fake.run(["exit", "0"], timeout=30)
    assert fake.ended is not None
    with pytest.raises(SessionRetry):  # never sent to it again
        await fake.run(["exit", "0"], timeout=30)


async def test_a_session_that_ends_during_a_call_is_a_transport_error_naming_the_node(
    fake: HelperSession,
) -> None:
    call = asyncio.create_task(fake.run(["sleep", "5"], timeout=30))
    await asyncio.sleep(0.5)
    fake._close()  # the session's process is killed under the call
    with pytest.raises(TransportError, match="n1: the helper session ended during the call"):
        await call


async def test_a_node_that_runs_no_session_says_why(tmp_path: Path) -> None:
    refusal = "mlx-medic node: error: argument HELPER: invalid choice: 'session'"
    older = ["sh", "-c", f'echo "{refusal}" >&2; exit 2']
    with pytest.raises(SessionUnavailable, match="invalid choice: 'session'"):
        async with open_session(older):
            pass
