"""Cost of SSE framing per event (the per-chunk hot path of every streamed reply).

Feeds a realistic OpenAI chat.completion.chunk stream (~200 B per event) to SSEDecoder
in three read patterns and prints the median cost per event over many runs:
one event per read (typical), 16 events per read (bursty), and every event split in
two reads (a frame across TCP segments). Also NDJSON lines for Ollama, and one long
line (15 MiB, as a Responses ``response.completed`` with thousands of citations grows)
arriving in 64 KiB reads: kept in pieces and joined once, not copied on every read.

    .venv/bin/python scripts/bench_transport.py
"""

from __future__ import annotations

import json
import statistics
import time

from gelbridge._transport import NDJSONDecoder, SSEDecoder

EVENTS = 2000
RUNS = 41


def openai_chunk(i: int) -> bytes:
    doc = {"id": "chatcmpl-AbCdEf0123456789", "object": "chat.completion.chunk",
           "created": 1718000000, "model": "gpt-4o-mini-2024-07-18",
           "choices": [{"index": 0, "delta": {"content": f" word{i % 100}"}, "finish_reason": None}]}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def per_event(reads: list[bytes], n_events: int, make, runs: int = RUNS) -> str:
    """Median and minimum over runs of the mean cost per event, in µs. The minimum is
    the better figure on a busy machine (it is the least disturbed run)."""
    samples = []
    for _ in range(runs):
        d = make()
        feed = d.feed
        t0 = time.perf_counter_ns()
        got = 0
        for r in reads:
            got += len(feed(r))
        got += len(d.close())
        samples.append((time.perf_counter_ns() - t0) / n_events)
        assert got == n_events, got
    return f"median {statistics.median(samples) / 1000:6.2f} µs   min {min(samples) / 1000:6.2f} µs"


def long_line(make, head: bytes, runs: int = 9) -> str:
    """Median ms to frame one 15 MiB line that arrives in 64 KiB reads."""
    body = head + b"x" * (15 * 1024 * 1024) + b"\n\n"
    reads = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    samples = []
    for _ in range(runs):
        d = make()
        t0 = time.perf_counter()
        got = sum(len(d.feed(r)) for r in reads) + len(d.close())
        samples.append((time.perf_counter() - t0) * 1000)
        assert got == 1, got
    return f"median {statistics.median(samples):6.1f} ms"


def main() -> None:
    chunks = [openai_chunk(i) for i in range(EVENTS)]
    size = statistics.mean(len(c) for c in chunks)
    one = chunks
    burst = [b"".join(chunks[i:i + 16]) for i in range(0, EVENTS, 16)]
    split = [p for c in chunks for p in (c[: len(c) // 2], c[len(c) // 2:])]
    crlf = [c.replace(b"\n", b"\r\n") for c in chunks]
    nd = [json.dumps({"model": "llama3", "message": {"role": "assistant", "content": f" w{i}"},
                      "done": False}).encode() + b"\n" for i in range(EVENTS)]
    print(f"SSE event size: {size:.0f} bytes; {EVENTS} events x {RUNS} runs, cost per event")
    print(f"  one event per read      {per_event(one, EVENTS, SSEDecoder)}")
    print(f"  16 events per read      {per_event(burst, EVENTS, SSEDecoder)}")
    print(f"  each event in two reads {per_event(split, EVENTS, SSEDecoder)}")
    print(f"  CRLF, one per read      {per_event(crlf, EVENTS, SSEDecoder)}")
    print(f"NDJSON line, one per read {per_event(nd, EVENTS, NDJSONDecoder)}")
    print(f"one 15 MiB SSE line       {long_line(SSEDecoder, b'data: ')}")
    print(f"one 15 MiB NDJSON line    {long_line(NDJSONDecoder, b'')}")


if __name__ == "__main__":
    main()
