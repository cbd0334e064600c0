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
    """The slow model server (run in a child process): OpenAI Chat Completions SSE, the
    frames of the local wire server (``_dev._wire_openai``, which the official SDK's tests
    check), one every 50 ms, on asyncio so that a thousand streams at once cost the
    server little (the threaded ``ModelServer`` spends a core on a few hundred)."""
    import json as _json

    from gelbridge._dev._wire_common import Turn, WireContext
    from gelbridge._dev._wire_openai import render_stream

    chunks = max(1, int(seconds / CHUNK_DELAY))
    turn = Turn(text="word " * (chunks * 2), chunk_size=10)
    frames = render_stream(turn, WireContext(model="echo", seq=1, created=int(time.time()), prompt_text="",
                                             chunk_size=10))
    frames.append(b"data: [DONE]\n\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = _json.loads(await reader.readexactly(length)) if length else {}
                assert body.get("stream") is True
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
                for frame in frames:
                    writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    await writer.drain()
                    await asyncio.sleep(CHUNK_DELAY)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.sleep(seconds * 4 + 120)

    asyncio.run(main())


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(url: str, turns: int, streams_per_runtime: int | None = None) -> None:
    from gelbridge._adapters.client import ModelClient
    from gelbridge._config import AdaptersConfig, ProviderConfig, Settings
    from gelbridge.lux import LuxRequest, Message, Options, Text

    adapters = AdaptersConfig() if streams_per_runtime is None else AdaptersConfig(
        streams_per_runtime=streams_per_runtime)
    settings = Settings(providers={"local": ProviderConfig(adapter="openai", base_url=url + "/v1", max_retries=0,
                                                           read_timeout=60.0, deadline=900.0)},
                        adapters=adapters)
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
        spr = int(args["streams-per-runtime"]) if "streams-per-runtime" in args else None
        asyncio.run(run(url, turns, spr))
    finally:
        child.terminate()
        child.wait(10)


if __name__ == "__main__":
    main()
