"""The turn engine's own cost (``_worker/turn.py``'s ``run_turn``), per turn and per
streamed event, with no I/O and no model: bench_core's 20-message sealed thread, a fresh
user message per turn (siblings under its last reply), the records and their opened
content already in the worker's caches, an in-memory repo (``OfflineRepo``) and a state
store that does nothing. The model is a stand-in that feeds canned Lux stream events to
the turn's ``on_event`` hook (yielding to the event loop every 100) and returns the
canned response; the writer's clock moves 20 ms per event, as when a model streams 50
events a second, so with [replies] update_interval 2 s a progress write lands every 200
events (the interval counts from when the previous one landed).

Three turns, median ms over ``--n`` turns each (interleaved in batches of 20):

- ``short``: one text delta, then the final write;
- ``stream``: 2,000 text deltas (10 progress writes), then the final write; ``per event``
  is ``(stream - short) / 1999`` in microseconds;
- ``tools``: a step of 200 deltas and a ``current_time`` call (run by a stand-in
  runner: checkpoint, results), then a step of 200 deltas.

``--against=REV`` runs the same measures on ``gelbridge/`` of ``REV`` (``git archive``)
and of the working tree, alternately, each in a fresh process (``--runs``, default 3),
and prints both with the median of their medians.

``--only=NAME`` measures one of them (JSON). Run under valgrind, its instruction count
does not move with the VM's speed: the count with ``--n=60`` less the count with
``--n=20`` is 40 turns' worth (the warm-up and the set-up cancel out):
``PYTHONPATH=TREE valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null
.venv/bin/python scripts/bench_turn.py --only=short --n=20`` (then ``--n=60``).

Run: ``.venv/bin/python scripts/bench_turn.py [--n=300] [--against=main [--runs=3]]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("short", "stream", "tools")
STREAM_EVENTS = 2000


class NullStore:
    """A state store that keeps nothing: every call returns None."""

    def __getattr__(self, name: str) -> Any:
        async def nothing(*_: Any, **__: Any) -> None:
            return None

        return nothing


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def text_events(index: int, deltas: int) -> list[Any]:
    from gelbridge.lux import BlockDelta, BlockEnd, BlockStart, TextDelta

    return [BlockStart(index, "text"), *(BlockDelta(index, TextDelta("word ")) for _ in range(deltas)),
            BlockEnd(index)]


def scripts() -> dict[str, list[list[Any]]]:
    """Per scenario, the events of each model call of one turn."""
    from gelbridge.lux import (
        BlockDelta,
        BlockEnd,
        BlockStart,
        DoneEvent,
        FinishEvent,
        ToolArgumentsDelta,
        ToolCallStart,
        Usage,
        UsageEvent,
    )

    def end(reason: str) -> list[Any]:
        return [FinishEvent(reason), UsageEvent(Usage(1000, 200, 1200)), DoneEvent()]

    call = [BlockStart(1, ToolCallStart("call_bench", "current_time")),
            BlockDelta(1, ToolArgumentsDelta('{"timezone": "UTC"}')), BlockEnd(1)]
    return {
        "short": [text_events(0, 1) + end("stop")],
        "stream": [text_events(0, STREAM_EVENTS) + end("stop")],
        "tools": [text_events(0, 200) + call + end("tool_calls"), text_events(0, 200) + end("stop")],
    }


class ScriptedModel:
    """Feeds each call's events to ``on_event`` (yielding to the loop every 100, so
    progress writes land) and returns the response they make."""

    def __init__(self, calls: list[list[Any]], clock: Clock) -> None:
        from gelbridge._adapters.client import ModelResult, ModelTiming
        from gelbridge.lux import StreamAccumulator

        self.calls, self.clock, self.n = calls, clock, 0
        self.results = [ModelResult(StreamAccumulator(provider="openai", model="gpt-4o-mini").feed_all(evs).result(),
                                    [], ModelTiming()) for evs in calls]

    async def complete(self, request: Any, *, provider: str, stream: bool | None = None, on_event: Any = None) -> Any:
        i = self.n % len(self.calls)
        self.n += 1
        if on_event is not None:
            for k, ev in enumerate(self.calls[i]):
                self.clock.t += 0.02
                on_event(ev)
                if k % 100 == 99:
                    await asyncio.sleep(0)
        return self.results[i]

    async def aclose(self) -> None:
        return None


async def measure(n: int, scenarios: tuple[str, ...] = SCENARIOS) -> dict[str, float]:
    """Median ms per turn for each scenario (whichever ``gelbridge`` is on the path)."""
    import bench_core

    from gelbridge._config import Settings
    from gelbridge._mapping import OpenedRecordCache
    from gelbridge._records import AtUri, GenerationRequest, MessageRecord, PlainContent, TextPart
    from gelbridge._records.io import RecordEntry
    from gelbridge._records.models import ToolResultPart
    from gelbridge._sealing import Keyring, seal_content
    from gelbridge._tools.loader import builtin_tools
    from gelbridge._tools.registry import ToolRegistry
    from gelbridge._worker.decide import peek_ask
    from gelbridge._worker.offline import OfflineRepo
    from gelbridge._worker.repo import RepoView
    from gelbridge._worker.turn import TurnDeps, TurnJob, run_turn
    from gelbridge._worker.writer import ReplyWriter

    logging.getLogger("gelbridge").setLevel(logging.CRITICAL)
    ring = Keyring()
    ring.add_new("k1")
    entries, last = bench_core.make_thread(ring)
    did, coll = bench_core.DID, bench_core.COLL
    settings = Settings.model_validate({
        "account": {"pds": "http://127.0.0.1:9", "identifier": "bench.test", "password_env": "UNUSED"},
        "defaults": {"model": {"provider": "openai", "id": "gpt-4o-mini"}, "tools": ["current_time"]},
        "providers": {"openai": {"adapter": "openai", "base_url": "http://127.0.0.1:9/v1"}},
    })
    repo = OfflineRepo([RecordEntry(AtUri.parse(u), c, v) for u, c, v in entries], did)
    view, opened = RepoView(repo, did), OpenedRecordCache()
    for u, c, v in entries:
        view.put(u.rpartition("/")[2], c, v)
    parent = f"{entries[-2][0].rpartition('/')[2]}"  # the last reply: each new message answers it
    clock = Clock()
    registry = ToolRegistry(builtin_tools(settings.tools))

    async def runner(deps: Any, job: Any, calls: list[Any], key: Any) -> dict[str, Any]:
        return {c.call_id: ToolResultPart(call_id=c.call_id, output='{"utc": "2026-01-01T00:00:00Z"}') for c in calls}

    count = 0

    def message() -> tuple[str, dict[str, Any]]:
        nonlocal count
        count += 1
        rkey = f"3mbenchmsg{count:06d}"
        uri = AtUri(did, coll, rkey)
        record = MessageRecord(
            conversation=bench_core.CONV, role="user", parent=parent,
            content=seal_content(PlainContent(parts=[TextPart(text="And one more question, please. " * 4)]),
                                 uri=uri, key_id="k1", keyring=ring),
            generation=GenerationRequest(attempt=0), created_at="2026-01-01T00:00:02.000Z")
        value = json.loads(json.dumps(record.to_value()))
        repo.records[(coll, rkey)] = (f"cid-{rkey}", value)
        view.put(rkey, f"cid-{rkey}", value)
        return rkey, value

    async def one(calls: list[list[Any]]) -> float:
        rkey, value = message()
        ask = peek_ask(coll, rkey, value)
        assert ask is not None
        model = ScriptedModel(calls, clock)
        deps = TurnDeps(settings=settings, pds=repo, did=did, keyring=ring, store=NullStore(),  # type: ignore[arg-type]
                        view=view, opened=opened, model=model, registry=registry, tool_runner=runner)
        writer = ReplyWriter(repo, view, reply_rkey=ask.reply_rkey, message_rkey=rkey, conversation=ask.conversation,
                             key_id=ask.key_id, keyring=ring, clock=clock)
        await writer.claim()
        t0 = time.perf_counter()
        report = await run_turn(deps, TurnJob(ask=ask, writer=writer, received_at=time.monotonic()))
        ms = (time.perf_counter() - t0) * 1000
        assert str(report.status) == "complete", report
        return ms

    plans = scripts()
    for name in scenarios:  # warm-up: caches, the thread's opened records
        for _ in range(10):
            await one(plans[name])
    times: dict[str, list[float]] = {name: [] for name in scenarios}
    for _ in range(max(1, n // 20)):
        for name in scenarios:
            for _ in range(20):
                times[name].append(await one(plans[name]))
    out = {name: statistics.median(v) for name, v in times.items()}
    if "stream" in out and "short" in out:
        out["per_event_us"] = (out["stream"] - out["short"]) / (STREAM_EVENTS - 1) * 1000
    return out


def show(label: str, r: dict[str, float]) -> str:
    return (f"{label:<8} short {r['short']:7.3f} ms  stream {r['stream']:7.3f} ms  tools {r['tools']:7.3f} ms  "
            f"per event {r['per_event_us']:6.2f} us")


def export_tree(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gelbridge", "adapters"], check=True,
                             capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    return into


def against(rev: str, runs: int, n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-turn-") as tmp:
        trees = {rev: export_tree(rev, Path(tmp)), "tree": ROOT}
        got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for i in range(runs):
            for name, tree in trees.items():
                out = subprocess.run([sys.executable, __file__, "--child", f"--n={n}"],
                                     env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tempfile.gettempdir(),
                                     capture_output=True, text=True, timeout=1800, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if not r.pop("gelbridge").startswith(str(tree)):
                    raise SystemExit(f"run {i}: {name} imported another gelbridge")
                got[name].append(r)
                print(show(f"run {i} {name}", r), flush=True)
        for name, rs in got.items():
            print(show(name, {k: statistics.median(r[k] for r in rs) for k in rs[0]}) + f"  (median of {runs})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--against")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--only", choices=SCENARIOS, help="measure this turn only (prints JSON)")
    args = ap.parse_args()
    if args.against:
        against(args.against, args.runs, args.n)
        return
    if not args.child:
        sys.path.insert(0, str(ROOT))
    import gelbridge

    r = asyncio.run(measure(args.n, (args.only,) if args.only else SCENARIOS))
    print(json.dumps({"gelbridge": gelbridge.__file__, **r}) if args.child or args.only else show("tree", r))


if __name__ == "__main__":
    main()
