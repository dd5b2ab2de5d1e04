"""Alert-storm load generator: POSTs Alertmanager webhook payloads, 90 % of them
repeats of a delivery already sent (Alertmanager's at-least-once retries), the rest
new firings for the same few models. Closed loop: `--concurrency` connections each
send the next request as soon as the previous answer is read. Prints one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def payload(model: str, fingerprint: str, starts_at: datetime) -> bytes:
    stamp = starts_at.isoformat().replace("+00:00", "Z")
    alert = {
        "status": "firing",
        "labels": {"alertname": "LLMModelDown", "model": model, "severity": "critical"},
        "annotations": {"summary": f"{model} answers no health probe"},
        "startsAt": stamp,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example/graph",
        "fingerprint": fingerprint,
    }
    return json.dumps(
        {
            "version": "4",
            "groupKey": f'{{}}:{{model="{model}"}}',
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "mlx-medic",
            "groupLabels": {"model": model},
            "commonLabels": alert["labels"],
            "commonAnnotations": {},
            "externalURL": "http://alertmanager.example:9093",
            "alerts": [alert],
        }
    ).encode()


def plan(requests: int, models: int, repeat: float, seed: int) -> tuple[list[bytes], int]:
    """The bodies in send order, and how many of them are new firings."""
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(minutes=5)
    sent: list[bytes] = []
    bodies: list[bytes] = []
    for i in range(requests):
        if i < models or rng.random() >= repeat:
            model = f"m{i % models if i < models else rng.randrange(models)}"
            n = len(sent)
            body = payload(model, f"{n:016x}", start + timedelta(milliseconds=n))
            sent.append(body)
        else:
            body = rng.choice(sent)
        bodies.append(body)
    return bodies, len(sent)


async def storm(
    url: str, bodies: list[bytes], concurrency: int, token: str | None
) -> dict[str, Any]:
    import aiohttp

    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    latencies: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    dispositions: collections.Counter[str] = collections.Counter()
    queue = iter(bodies)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def worker() -> None:
            for body in queue:
                began = time.perf_counter()
                async with session.post(url, data=body) as response:
                    answer = await response.read()
                latencies.append(time.perf_counter() - began)
                statuses[response.status] += 1
                if response.status == 202:
                    for alert in json.loads(answer).get("alerts", []):
                        dispositions[alert["disposition"]] += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1] * 1000, 2),
        "statuses": dict(statuses),
        "dispositions": dict(dispositions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--repeat", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--token-file", type=Path, default=None)
    args = parser.parse_args()
    bodies, unique = plan(args.requests, args.models, args.repeat, args.seed)
    token = args.token_file.read_text().strip() if args.token_file else None
    result = asyncio.run(storm(args.url, bodies, args.concurrency, token))
    result["new_firings"] = unique
    print(json.dumps(result))


if __name__ == "__main__":
    main()
