"""Core turn cost for a 20-message sealed thread (no I/O, no model).

One turn = look up the 20 records + open (decrypt) their sealed content + walk the
thread + choose model/tools/effort + build the Lux IR request + the adapter step +
``response_to_parts`` of a typical response + seal the reply.

Adapter step: with the built-in ``openai`` Lua adapter (the brief's full bridge
overhead), the Lux request goes through ``provider_body`` (conversion +
``transform_request``) and a canned OpenAI Chat Completions response body comes back
through ``transform_response`` + ``lux_response_from_adapter``; without it, the Lux
request is serialised with ``to_json`` + ``orjson.dumps`` (issue 2's own measure).

Three states of the records, measured side by side in one run (interleaved batches,
so a slow spell of the VM hits all of them alike):

- ``cold``: nothing known; all 20 record values are parsed and validated and their
  content decrypted in the turn (``gelbridge convert``; the first turn after a restart).
- ``decrypt``: the records are parsed (the worker validated each when it arrived) but
  every sealed content is decrypted again in the turn: the brief's "decrypt a
  20-message thread, map, adapter, parse, seal".
- ``warm``: parsed and opened records come from ``OpenedRecordCache`` by (uri, cid):
  the worker's steady state, where only the new message is new.

Run: ``.venv/bin/python scripts/bench_core.py [--n=2000] [--profile [--adapter] [--mode=cold]]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import orjson

from gelbridge._adapters.client import provider_body
from gelbridge._adapters.contract import loads_json, lux_response_from_adapter
from gelbridge._adapters.host import Adapter
from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge._config import DefaultsConfig, ModelChoice
from gelbridge._mapping import (
    OpenedMessage,
    OpenedRecordCache,
    build_request,
    choose_turn,
    response_to_parts,
)
from gelbridge._records import (
    AtUri,
    GenerationRequest,
    MessageRecord,
    ModelRef,
    PlainContent,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from gelbridge._records import (
    Usage as RUsage,
)
from gelbridge._sealing import Keyring, content_of, seal_content
from gelbridge._thread import previous_reply_rkey, walk_thread
from gelbridge.lux import Choice, LuxResponse, Message, Text, Thinking, ToolUse, Usage

DID = "did:plc:examplegelbridgedemo2345"
COLL = "chat.gel.assistant.message"
CONV = "3mconvconvcv2"
MODEL = ModelRef(provider="openai", id="gpt-4o-mini")


def make_thread(ring: Keyring) -> tuple[list[tuple[str, str, dict]], str]:
    """20 sealed messages (10 user, 10 replies with reasoning, text, some tool calls)."""
    out = []
    parent = None
    last = ""
    for i in range(10):
        k = f"3mabcdefgh{i:02d}2".replace("0", "a").replace("1", "b")[:13]
        k = k[:10] + "aa" + "bcdefghijk"[i]
        uri = AtUri(DID, COLL, k)
        u = MessageRecord(
            conversation=CONV, role="user", parent=parent,
            content=seal_content(PlainContent(parts=[TextPart(text=f"Question {i}: " + "please explain this " * 12)]),
                                 uri=uri, key_id="k1", keyring=ring),
            generation=GenerationRequest(attempt=0), created_at="2026-01-01T00:00:00.000Z")
        out.append((str(uri), f"cid-u{i}", json.loads(json.dumps(u.to_value()))))
        last = k
        if i == 9:
            break
        rk = f"{k}.r0"
        ruri = AtUri(DID, COLL, rk)
        parts = [ReasoningPart(text="Let me think about it. " * 10), TextPart(text="Here is the answer. " * 25)]
        if i % 3 == 0:
            parts += [ToolCallPart(call_id=f"call_{i}", tool="current_time", input="{}"),
                      ToolResultPart(call_id=f"call_{i}", output='{"utc": "2026-01-01T00:00:00Z"}'),
                      TextPart(text="It is midnight.")]
        r = MessageRecord(
            conversation=CONV, role="assistant", parent=k,
            content=seal_content(PlainContent(parts=parts), uri=ruri, key_id="k1", keyring=ring),
            model=MODEL, usage=RUsage(input_tokens=100, output_tokens=50), status="complete",
            finish_reason="stop", created_at="2026-01-01T00:00:01.000Z")
        out.append((str(ruri), f"cid-r{i}", json.loads(json.dumps(r.to_value()))))
        parent = rk
    return out, last


RESPONSE = LuxResponse("resp", "gpt-4o-mini", [Choice(0, Message("assistant", [
    Thinking("Reasoning about the question. " * 8),
    Text("The answer is forty-two. " * 30),
    ToolUse("call_x", "current_time", '{"timezone": "Europe/Berlin"}'),
]), "tool_calls")], usage=Usage(1000, 200, 1200, reasoning_tokens=50))
DEFAULTS = DefaultsConfig(model=ModelChoice(provider="openai", id="gpt-4o-mini"))


CANNED_OPENAI = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1767225600, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "The answer is forty-two. " * 30,
        "reasoning_content": "Reasoning about the question. " * 8,
        "tool_calls": [{"id": "call_x", "type": "function", "function": {
            "name": "current_time", "arguments": '{"timezone": "Europe/Berlin"}'}}]}}],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
              "completion_tokens_details": {"reasoning_tokens": 50}},
}).decode()

STEPS = ("records", "open", "build", "adapter_req", "adapter_resp", "parts", "seal")


def turn(entries: list[tuple[str, str, dict]], message: str, ring: Keyring, cache: OpenedRecordCache | None,
         adapter: Adapter | None = None, steps: dict[str, list[float]] | None = None, *,
         reuse_opened: bool = True) -> bytes | str:
    """One turn; with ``steps`` each step's milliseconds are appended to ``steps[name]``.

    ``cache`` None: cold. With a cache, records come from it; their opened content too
    unless ``reuse_opened`` is False (then every content is decrypted again).
    """
    clock = time.perf_counter_ns
    t0 = clock()
    by_rkey = {u.rpartition("/")[2]: (u, c, v) for u, c, v in entries}

    def lookup(rkey: str) -> MessageRecord | None:
        e = by_rkey.get(rkey)
        if e is None:
            return None
        if cache is not None:
            return cache.record(e[0], e[1], e[2])
        return MessageRecord.from_value(e[2], uri=e[0])

    thread = walk_thread(message, lookup)
    t1 = clock()
    opened = []
    for t in thread.entries:
        uri, cid, _ = by_rkey[t.rkey]
        if cache is not None and reuse_opened:
            content = cache.content(uri, cid, t.record, keyring=ring)
        else:
            content = content_of(t.record.content, uri=uri, keyring=ring)
        opened.append(OpenedMessage(t.rkey, t.record, content))
    t2 = clock()
    prev_key = previous_reply_rkey(message, thread.message.record)
    in_thread = {e.rkey: e.record for e in thread.entries}
    prev = (in_thread.get(prev_key) or lookup(prev_key)) if prev_key else None
    choice = choose_turn(thread.message.record, previous_reply=prev, defaults=DEFAULTS)
    assert choice.model is not None
    req = build_request(opened, provider=choice.model.provider, model=choice.model.id, choice=choice,
                        instructions="You are helpful.")
    t3 = clock()
    if adapter is None:
        body: bytes | str = orjson.dumps(req.value.to_json())
        t4 = clock()
        response = RESPONSE
        t5 = t4
    else:
        body = provider_body(adapter, req.value, provider="openai", model=choice.model.id).value
        t4 = clock()
        obj = loads_json(adapter.transform_response(CANNED_OPENAI), "transform_response")
        response = lux_response_from_adapter(obj, provider="openai", model=choice.model.id).value
        t5 = clock()
    draft = response_to_parts(response, provider="openai", model="gpt-4o-mini",
                              needs_approval=lambda n: False, reply_rkey=f"{message}.r0")
    t6 = clock()
    reply_uri = f"at://{DID}/{COLL}/{message}.r0"
    seal_content(PlainContent(parts=draft.parts), uri=reply_uri, key_id="k1", keyring=ring)
    t7 = clock()
    if steps is not None:
        marks = (t0, t1, t2, t3, t4, t5, t6, t7)
        for name, a, b in zip(STEPS, marks, marks[1:]):
            steps[name].append((b - a) / 1e6)
    return body


def load_openai() -> Adapter:
    return AdapterRegistry.load(builtin_adapters_dir()).get("openai")


MODES = ("cold", "decrypt", "warm")
TARGET_MS = 1.0


def runner(mode: str, entries, last, ring, adapter: Adapter | None):
    """A ``steps -> None`` callable running one turn with the records in ``mode``."""
    cache = None if mode == "cold" else OpenedRecordCache()
    reuse = mode == "warm"
    if cache is not None:
        turn(entries, last, ring, cache, adapter, reuse_opened=reuse)  # fill the cache

    def run(steps=None):
        turn(entries, last, ring, cache, adapter, steps, reuse_opened=reuse)

    return run


def interleaved(runs: dict[str, object], rounds: int, batch: int) -> dict[str, list[float]]:
    """Per-turn milliseconds for each runner, measured in alternating batches."""
    out: dict[str, list[float]] = {k: [] for k in runs}
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for name, fn in runs.items():
            times = out[name]
            for _ in range(batch):
                t0 = clock()
                fn()
                times.append((clock() - t0) / 1e6)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def main() -> None:
    ring = Keyring()
    ring.add_new("k1")
    entries, last = make_thread(ring)
    adapter = load_openai()
    body = turn(entries, last, ring, None)
    assert len(json.loads(body)["conversation"]) >= 20
    pbody = turn(entries, last, ring, None, adapter)
    assert len(json.loads(pbody)["messages"]) >= 20
    n = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--n=")), "2000"))
    if "--profile" in sys.argv:
        import cProfile
        import pstats

        mode = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--mode=")), "cold")
        run = runner(mode, entries, last, ring, adapter if "--adapter" in sys.argv else None)
        cProfile.runctx("for _ in range(300): run()", globals(), locals(), "/tmp/core.prof")
        pstats.Stats("/tmp/core.prof").sort_stats("tottime").print_stats(25)
        return
    runs = {}
    for mode in MODES:
        runs[f"{mode}+adapter"] = runner(mode, entries, last, ring, adapter)
        runs[mode] = runner(mode, entries, last, ring, None)
    interleaved(runs, 2, 50)  # warm-up (LuaJIT traces, caches, allocator)
    batch = 100
    times = interleaved(runs, max(1, n // batch), batch)
    print(f"20-message sealed thread, one turn: {len(body)} bytes of Lux IR request JSON, "
          f"{len(pbody)} bytes of openai provider body; {len(times['cold'])} turns each, "
          f"interleaved in batches of {batch}")
    print(f"  {'records':9} {'adapter':>8} {'median':>8} {'p90':>8}   target {TARGET_MS:g} ms")
    for mode in MODES:
        for name, label in ((f"{mode}+adapter", "openai"), (mode, "none")):
            xs = times[name]
            med = statistics.median(xs)
            ok = "ok" if med < TARGET_MS else "OVER"
            print(f"  {mode:9} {label:>8} {med:8.3f} {pct(xs, 0.9):8.3f} ms  {ok}")
    print("per step with the openai adapter, median ms (" + " / ".join(MODES) + "):")
    steps = {}
    for mode in MODES:
        st: dict[str, list[float]] = {k: [] for k in STEPS}
        run = runs[f"{mode}+adapter"]
        for _ in range(max(200, n // 2)):
            run(st)
        steps[mode] = {k: statistics.median(v) for k, v in st.items()}
    for k in STEPS:
        print(f"  {k:13} " + " / ".join(f"{steps[m][k]:6.3f}" for m in MODES))


if __name__ == "__main__":
    main()
