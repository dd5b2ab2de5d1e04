"""The peer: a bare aiohttp handler on the same route, answering 202 with a small JSON
after reading the body; what aiohttp itself costs on this machine."""

from __future__ import annotations

import argparse

from aiohttp import web


async def alerts(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"status": "accepted"}, status=202)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/alerts", alerts)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
