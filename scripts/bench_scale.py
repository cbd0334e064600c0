"""Many streaming turns in flight in one process: what holds a worker back (issue 15).

N model calls stream at once through ``ModelClient`` (the real Lua adapter, transport
and accumulator) from a slow local model server in another process: one chunk every
50 ms for ``--seconds`` (default 30), the issue's "a model streams for tens of seconds".
Reported: how many streams completed and how the others failed, the wall time against
the ideal (the stream length), adapter work per chunk (median and p90 over the calls),
resident memory at the peak, and the Lua runtimes the adapter had to create (each
stream pins one for its whole length).

Target (issue 15): 1,000 concurrent streams on one core, every one complete, adapter
cost per chunk under 20 µs, resident memory under 1 GB. This script measures; it does
not fix.

Run: ``.venv/bin/python scripts/bench_scale.py [--turns=1000] [--seconds=30]``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter

CHUNK_DELAY = 0.05


def serve(seconds: float) -> None:
    """The slow model server (run in a child process)."""
    import threading

    from gelbridge._dev.model_server import ModelServer, Turn

    chunks = max(1, int(seconds / CHUNK_DELAY))
    turn = Turn(text="word " * (chunks * 2), chunk_size=10, chunk_delay=CHUNK_DELAY)
    with ModelServer(responder=lambda req: turn, record_requests=False) as server:
        print(server.url, flush=True)
        threading.Event().wait(seconds * 4 + 120)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(url: str, turns: int) -> None:
    from gelbridge._adapters.client import ModelClient
    from gelbridge._config import ProviderConfig, Settings
    from gelbridge.lux import LuxRequest, Message, Options, Text

    settings = Settings(providers={"local": ProviderConfig(adapter="openai", base_url=url + "/v1", max_retries=0,
                                                           read_timeout=60.0, deadline=900.0)})
    req = LuxRequest(model="echo", conversation=[Message("user", [Text("stream for a while")])],
                     options=Options(stream=True))
    from gelbridge._adapters import host

    made = [0]
    new = host._RuntimePool._new  # noqa: SLF001 - count the Lua runtimes the streams needed

    def counting_new(self: host._RuntimePool) -> object:  # noqa: SLF001
        made[0] += 1
        return new(self)

    host._RuntimePool._new = counting_new  # type: ignore[method-assign]  # noqa: SLF001
    failures: Counter[str] = Counter()
    per_chunk: list[float] = []
    async with ModelClient(settings) as client:

        async def one() -> None:
            try:
                res = await client.complete(req, provider="local")
            except Exception as e:  # noqa: BLE001 - counted, the bench goes on
                failures[f"{type(e).__name__}({getattr(e, 'kind', '')}): {str(e)[:90]}"] += 1
                return
            if res.timing.chunks:
                per_chunk.append(res.timing.adapter_ms * 1000 / res.timing.chunks)

        start = time.monotonic()
        await asyncio.gather(*(one() for _ in range(turns)))
        wall = time.monotonic() - start
        runtimes = made[0]
    done = len(per_chunk)
    per_chunk.sort()
    print(f"{turns} concurrent streams: {done} complete, {turns - done} failed")
    for why, n in failures.most_common(3):
        print(f"  {n} x {why}")
    print(f"  wall {wall:.1f} s; one core's CPU: {time.process_time():.1f} s")
    if per_chunk:
        print(f"  adapter work per chunk: median {statistics.median(per_chunk):.1f} µs, "
              f"p90 {per_chunk[int(len(per_chunk) * 0.9)]:.1f} µs")
    print(f"  peak resident memory {rss_mb():.0f} MB; Lua runtimes created for the streams: {runtimes}")


def main() -> None:
    args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    if "serve" in args:
        serve(float(args["serve"]))
        return
    turns, seconds = int(args.get("turns", 1000)), float(args.get("seconds", 30))
    child = subprocess.Popen([sys.executable, __file__, f"--serve={seconds}"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        print(f"model server {url}: one chunk every {CHUNK_DELAY * 1000:.0f} ms for {seconds:g} s per stream")
        asyncio.run(run(url, turns))
    finally:
        child.terminate()
        child.wait(10)


if __name__ == "__main__":
    main()
