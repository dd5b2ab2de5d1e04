"""The wrapper's watch over mlx.launch: every byte of its output reaches the service log,
however long a line, a rank's end is noticed, and a serving launch keeps only a tail of
its output in memory (it runs for weeks)."""

from __future__ import annotations

import sys

import pytest

from mlx_medic.serve.supervise import Launch


def printing(program: str) -> list[str]:
    return [sys.executable, "-c", program]


async def test_a_line_longer_than_the_stream_limit_is_copied_and_reading_goes_on(
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    long = "x" * 200_000  # asyncio's readline gives up past 64 KiB
    launch = Launch(printing("print('x' * 200_000); print('after')"))
    await launch.start()
    assert await launch.wait(30) == 0
    assert capfdbinary.readouterr().out == f"{long}\nafter\n".encode()
    assert "".join(list(launch.lines)[:-1]) == long and launch.lines[-1] == "after"


async def test_a_rank_that_ends_is_noticed_through_mlx_launchs_colours() -> None:
    launch = Launch(
        printing(
            r"print('\x1b[33m[WARN] Node with rank 1 exited with code 1 \x1b[0m'); print('more')"
        )
    )
    await launch.start()
    await launch.wait(30)
    assert launch.rank_ended == "[WARN] Node with rank 1 exited with code 1"


async def test_a_serving_launch_keeps_only_the_last_lines() -> None:
    launch = Launch(printing("for i in range(1000): print(i)"), keep=3)
    await launch.start()
    await launch.wait(30)
    assert list(launch.lines) == ["997", "998", "999"]


async def test_a_smoke_test_keeps_its_whole_output_for_the_verdict() -> None:
    launch = Launch(printing("for i in range(1000): print(i)"))
    await launch.start()
    await launch.wait(30)
    assert len(launch.lines) == 1000 and launch.output.startswith("0\n1\n")
