"""Core turn cost for a 20-message sealed thread (no I/O, no model).

One turn = parse 20 record values (JSON form) + open their sealed content + walk the
thread + choose model/tools/effort + build the Lux IR request + ``to_json`` +
``orjson.dumps`` + ``response_to_parts`` of a typical response + seal the reply.

"cold": nothing cached. "warm": parsed/opened records come from an
``OpenedRecordCache`` keyed by (uri, cid) (the worker's steady state: only the new
message is new). Run: ``.venv/bin/python scripts/bench_core.py [--profile]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import orjson

from gelbridge.config import DefaultsConfig, ModelChoice
from gelbridge.lux import Choice, LuxResponse, Message, Text, Thinking, ToolUse, Usage
from gelbridge.mapping import (
    OpenedMessage,
    OpenedRecordCache,
    build_request,
    choose_turn,
    response_to_parts,
)
from gelbridge.records import (
    AtUri,
    GenerationRequest,
    MessageRecord,
    ModelRef,
    PlainContent,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage as RUsage,
)
from gelbridge.sealing import Keyring, content_of, seal_content
from gelbridge.thread import previous_reply_rkey, walk_thread

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


def turn(entries: list[tuple[str, str, dict]], message: str, ring: Keyring, cache: OpenedRecordCache | None) -> bytes:
    by_rkey = {u.rpartition("/")[2]: (u, c, v) for u, c, v in entries}

    def lookup(rkey: str) -> MessageRecord | None:
        e = by_rkey.get(rkey)
        if e is None:
            return None
        if cache is not None:
            return cache.record(e[0], e[1], e[2])
        return MessageRecord.from_value(e[2], uri=e[0])

    thread = walk_thread(message, lookup)
    opened = []
    for t in thread.entries:
        uri, cid, _ = by_rkey[t.rkey]
        if cache is not None:
            content = cache.content(uri, cid, t.record, keyring=ring)
        else:
            content = content_of(t.record.content, uri=uri, keyring=ring)
        opened.append(OpenedMessage(t.rkey, t.record, content))
    prev_key = previous_reply_rkey(message, thread.message.record)
    in_thread = {e.rkey: e.record for e in thread.entries}
    prev = (in_thread.get(prev_key) or lookup(prev_key)) if prev_key else None
    choice = choose_turn(thread.message.record, previous_reply=prev, defaults=DEFAULTS)
    assert choice.model is not None
    req = build_request(opened, provider=choice.model.provider, model=choice.model.id, choice=choice,
                        instructions="You are helpful.")
    body = orjson.dumps(req.value.to_json())
    draft = response_to_parts(RESPONSE, provider="openai", model="gpt-4o-mini",
                              needs_approval=lambda n: False, reply_rkey=f"{message}.r0")
    reply_uri = f"at://{DID}/{COLL}/{message}.r0"
    seal_content(PlainContent(parts=draft.parts), uri=reply_uri, key_id="k1", keyring=ring)
    return body


def measure(fn, n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


def main() -> None:
    ring = Keyring()
    ring.add_new("k1")
    entries, last = make_thread(ring)
    body = turn(entries, last, ring, None)
    assert len(json.loads(body)["conversation"]) >= 20
    if "--profile" in sys.argv:
        import cProfile
        import pstats

        cProfile.runctx("for _ in range(300): turn(entries, last, ring, None)", globals(), locals(), "/tmp/core.prof")
        pstats.Stats("/tmp/core.prof").sort_stats("tottime").print_stats(25)
        return
    for _ in range(50):
        turn(entries, last, ring, None)
    cold = measure(lambda: turn(entries, last, ring, None), 2000)
    cache = OpenedRecordCache()
    turn(entries, last, ring, cache)
    warm = measure(lambda: turn(entries, last, ring, cache), 2000)
    print(f"20-message sealed thread, one turn ({len(body)} bytes of request JSON)")
    print(f"cold: median {cold[0]:.3f} ms  p90 {cold[1]:.3f} ms")
    print(f"warm: median {warm[0]:.3f} ms  p90 {warm[1]:.3f} ms  (OpenedRecordCache by (uri, cid))")


if __name__ == "__main__":
    main()
