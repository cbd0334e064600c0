"""Mapping cost of one turn for bench_core's 20-message sealed thread (no I/O, no model).

Three medians in microseconds, each over ``--n`` runs (default 5000):

- ``walk``: ``walk_thread`` over already-parsed records in a dict (its own work:
  the record lookups are plain ``dict.get``);
- ``build``: ``choose_turn`` + ``build_request`` for the 20 opened messages;
- ``parts``: ``response_to_parts`` of bench_core's typical response.

The thread and the response come from ``scripts/bench_core.py`` (imported, not
copied). ``--json`` prints the medians as one JSON object (for interleaved
old/new comparisons). Run: ``.venv/bin/python scripts/bench_mapping.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core  # noqa: E402

from gelbridge._mapping import OpenedMessage, build_request, choose_turn, response_to_parts  # noqa: E402
from gelbridge._records import MessageRecord  # noqa: E402
from gelbridge._sealing import Keyring, content_of  # noqa: E402
from gelbridge._thread import previous_reply_rkey, walk_thread  # noqa: E402


def median_us(fn, n: int) -> float:
    clock = time.perf_counter_ns
    times = []
    for _ in range(n):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times) / 1000


def main() -> None:
    n = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--n=")), "5000"))
    ring = Keyring()
    ring.add_new("k1")
    entries, last = bench_core.make_thread(ring)
    records = {u.rpartition("/")[2]: MessageRecord.from_value(v, uri=u) for u, _, v in entries}
    uris = {u.rpartition("/")[2]: u for u, _, _ in entries}
    thread = walk_thread(last, records)
    opened = [OpenedMessage(e.rkey, e.record, content_of(e.record.content, uri=uris[e.rkey], keyring=ring))
              for e in thread.entries]
    message = thread.message.record
    prev_key = previous_reply_rkey(last, message)
    prev = records.get(prev_key) if prev_key else None

    def build() -> None:
        choice = choose_turn(message, previous_reply=prev, defaults=bench_core.DEFAULTS)
        build_request(opened, provider=choice.model.provider, model=choice.model.id, choice=choice,
                      instructions="You are helpful.")

    def parts() -> None:
        response_to_parts(bench_core.RESPONSE, provider="openai", model="gpt-4o-mini",
                          needs_approval=lambda name: False, reply_rkey=f"{last}.r0")

    def walk() -> None:
        walk_thread(last, records)

    fns = {"walk": walk, "build": build, "parts": parts}
    for fn in fns.values():
        for _ in range(200):
            fn()
    result = {name: median_us(fn, n) for name, fn in fns.items()}
    if "--json" in sys.argv:
        print(json.dumps(result))
        return
    print(f"20-message thread, median µs over {n} runs")
    for name, us in result.items():
        print(f"  {name:6} {us:8.1f}")


if __name__ == "__main__":
    main()
