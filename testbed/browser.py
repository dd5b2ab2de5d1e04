"""Debian's headless Chromium, as the tests and the pictures load a page: a fresh
profile per call, no sandbox (root), nothing fetched but the page itself."""

from __future__ import annotations

import asyncio
import base64
import itertools
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from testbed.cluster import TestbedError

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _binary() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        raise TestbedError("chromium is not installed (scripts/setup.sh --test installs it)")
    return binary


def _profile(profiles: Path) -> Path:
    return profiles / f"chromium-{uuid.uuid4().hex[:8]}"


def chromium(
    url: str, profiles: Path, *mode: str, size: str = "1280,900"
) -> subprocess.CompletedProcess[str]:
    """Chromium on `url` with `mode` (`--dump-dom`, `--screenshot=FILE`, ...) at the window
    `size` ("WIDTH,HEIGHT"), its profile a new directory under `profiles`."""
    binary, profile = _binary(), _profile(profiles)
    return subprocess.run(
        [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", *mode, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


@asynccontextmanager
async def devtools_page(
    url: str, profiles: Path, width: int, height: int
) -> AsyncIterator[Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]]:
    """Chromium showing `url` in a `width` x `height` viewport (CSS pixels; a window
    cannot be narrower than 500 px, an emulated viewport can), once it has loaded; yields
    a call of the DevTools protocol (method, params) answering its result. Evaluation
    there is outside the page's Content-Security-Policy (the on-call page allows no
    scripts)."""
    binary, profile = _binary(), _profile(profiles)
    process = await asyncio.create_subprocess_exec(
        binary,
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={max(width, 500)},{height}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    calls = itertools.count(1)
    try:
        async with asyncio.timeout(60), aiohttp.ClientSession() as session:
            target = await _page_target(session, profile / "DevToolsActivePort", process)
            async with session.ws_connect(target, max_msg_size=0) as socket:

                async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
                    number = next(calls)
                    await socket.send_json({"id": number, "method": method, "params": params})
                    answer = await socket.receive_json()
                    while answer.get("id") != number:  # events in between
                        answer = await socket.receive_json()
                    if "error" in answer:
                        raise TestbedError(f"DevTools {method}: {answer['error']}")
                    return dict(answer["result"])

                size = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
                await call("Emulation.setDeviceMetricsOverride", size)
                await call("Page.navigate", {"url": url})
                while not await _evaluate(call, LOADED):
                    await asyncio.sleep(0.1)
                yield call
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


LOADED = "location.protocol !== 'about:' && document.readyState === 'complete'"


async def _evaluate(
    call: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]], expression: str
) -> Any:
    params = {"expression": expression, "returnByValue": True}
    return (await call("Runtime.evaluate", params))["result"].get("value")


async def evaluate(url: str, profiles: Path, width: int, expression: str) -> Any:
    """`expression`'s value once `url` has loaded in Chromium `width` px wide."""
    async with devtools_page(url, profiles, width, 900) as call:
        return await _evaluate(call, expression)


async def screenshot_whole_page(url: str, profiles: Path, width: int, picture: Path) -> None:
    """`url` at `width` px into the PNG `picture`, the page's whole length."""
    async with devtools_page(url, profiles, width, 900) as call:
        height = await _evaluate(call, "document.documentElement.scrollHeight")
        size = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        await call("Emulation.setDeviceMetricsOverride", size)
        shot = await call("Page.captureScreenshot", {"format": "png"})
        picture.write_bytes(base64.b64decode(shot["data"]))


async def _page_target(
    session: aiohttp.ClientSession, port_file: Path, process: asyncio.subprocess.Process
) -> str:
    """The DevTools WebSocket of the page Chromium opened, once Chromium listens."""
    while True:
        if process.returncode is not None:
            raise TestbedError(f"chromium exited with status {process.returncode}")
        lines = port_file.read_text().split() if port_file.exists() else []
        if lines:
            async with session.get(f"http://127.0.0.1:{lines[0]}/json/list") as response:
                pages = [t for t in await response.json() if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        await asyncio.sleep(0.1)
