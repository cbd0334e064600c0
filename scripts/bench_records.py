"""Cost of reading and writing typical sealed messages, per operation.

Run: ``.venv/bin/python scripts/bench_records.py [--cpu] [--against=DIR]``. Prints the
median per call (µs) of several repeats, and the minimum. ``--cpu`` times with the
thread's CPU clock instead of the wall clock: steadier on a busy machine (time spent
waiting for the CPU is not counted).

``--against=DIR`` (a checkout, e.g. ``git worktree add /tmp/base HEAD``) instead compares
``open_content`` of DIR's ``gelbridge/_sealing.py`` with this tree's, in one process and in
alternating batches (so a slow spell hits both alike), and prints both medians and the
median of the paired differences. Only ``sealing.py`` comes from DIR: the models are
this tree's.

Operations: ``MessageRecord.from_value`` of a user message and of a reply in the JSON
form (XRPC) and the CBOR form (firehose/CAR); ``content_of`` (decrypt + JSON + model)
of 1, 3 and 5 parts; ``seal_content`` of a 3- and a 5-part reply; and the records/open
share of a 20-message turn estimated from them.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
import timeit
from collections.abc import Callable

import libipld

from gelbridge._records import (
    GenerationRequest,
    MessageRecord,
    ModelRef,
    PlainContent,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from gelbridge._sealing import Keyring, content_of, open_content, seal_content

URI = "at://did:plc:examplegelbridgedemo2345/chat.gel.assistant.message/3mabcdefghij2"
REPLY_URI = URI + ".r0"


def _cbor_form(json_form: dict, content) -> dict:  # noqa: ANN001
    sealed = {**json_form["content"], "nonce": content.nonce, "ciphertext": content.ciphertext}
    return libipld.decode_dag_cbor(libipld.encode_dag_cbor({**json_form, "content": sealed}))


def compare(against: str, cases: dict[str, PlainContent], timer: Callable[[], float], rounds: int = 41) -> None:
    """Interleaved A/B of ``open_content``: ``against``'s sealing.py vs this tree's."""
    spec = importlib.util.spec_from_file_location("_sealing_against", f"{against}/gelbridge/_sealing.py")
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = other  # dataclasses look their module up
    spec.loader.exec_module(other)
    ring = Keyring()
    ring.add_new("k1")
    other_ring = other.Keyring({"k1": ring["k1"]})
    print(f"open_content µs per call, median of {rounds} alternating batches (min of 3 x 500 calls each)")
    print(f"{'':<12}{against:>22}{'this tree':>12}{'paired diff':>13}")
    for name, pc in cases.items():
        enc = seal_content(pc, uri=REPLY_URI, key_id="k1", keyring=ring)
        fns = {
            "other": lambda: other.open_content(enc, uri=REPLY_URI, keyring=other_ring),
            "this": lambda: open_content(enc, uri=REPLY_URI, keyring=ring),
        }
        assert fns["other"]() == fns["this"]() == pc
        per: dict[str, list[float]] = {k: [] for k in fns}
        for i in range(rounds):
            for k in (("other", "this") if i % 2 else ("this", "other")):
                per[k].append(min(timeit.repeat(fns[k], number=500, repeat=3, timer=timer)) / 500 * 1e6)
        diff = statistics.median(a - b for a, b in zip(per["other"], per["this"]))
        print(f"{name:<12}{statistics.median(per['other']):22.2f}{statistics.median(per['this']):12.2f}{diff:13.2f}")


def main() -> None:
    timer = time.thread_time if "--cpu" in sys.argv else time.perf_counter
    ring = Keyring()
    ring.add_new("k1")
    text = "Could you summarise the main points of the attached article in three bullets? " * 6
    content = seal_content(PlainContent(parts=[TextPart(text=text)]), uri=URI, key_id="k1", keyring=ring)
    rec = MessageRecord(
        conversation="3mconvconvcv2",
        role="user",
        parent="3mabcdefghii2.r0",
        content=content,
        generation=GenerationRequest(attempt=0),
        created_at="2026-01-01T00:00:00.000Z",
    )
    json_form = json.loads(json.dumps(rec.to_value()))
    cbor_form = _cbor_form(json_form, content)
    parsed = MessageRecord.from_value(json_form)

    reasoning = ReasoningPart(text="Let me think about it. " * 10)
    answer = TextPart(text="Here is the answer. " * 25)
    call = ToolCallPart(call_id="call_1", tool="current_time", input='{"timezone": "Europe/Berlin"}')
    result = ToolResultPart(call_id="call_1", output='{"utc": "2026-01-01T00:00:00Z"}')
    three = PlainContent(parts=[reasoning, answer, call])
    five = PlainContent(parts=[reasoning, answer, call, result, TextPart(text="It is midnight.")])
    reply_content = seal_content(five, uri=REPLY_URI, key_id="k1", keyring=ring)
    reply = MessageRecord(
        conversation="3mconvconvcv2", role="assistant", parent="3mabcdefghij2", content=reply_content,
        model=ModelRef(provider="openai", id="gpt-4o-mini"), usage=Usage(input_tokens=100, output_tokens=50),
        status="complete", finish_reason="stop", created_at="2026-01-01T00:00:01.000Z",
    )
    reply_json = json.loads(json.dumps(reply.to_value()))
    reply_cbor = _cbor_form(reply_json, reply_content)
    sealed_three = seal_content(three, uri=REPLY_URI, key_id="k1", keyring=ring)
    against = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--against=")), None)
    if against:
        compare(against, {"1 part": PlainContent(parts=[TextPart(text=text)]), "3 parts": three, "5 parts": five}, timer)
        return

    def bench(name: str, fn: Callable[[], object], n: int = 2000) -> float:
        for _ in range(n // 10):
            fn()
        per = [t / n * 1e6 for t in timeit.repeat(fn, number=n, repeat=7, timer=timer)]
        med = statistics.median(per)
        print(f"{name:<40} {med:8.1f} µs  (min {min(per):.1f})")
        return med

    print(f"median per call{' (thread CPU time)' if timer is time.thread_time else ''}:")
    a = bench("from_value (JSON form)", lambda: MessageRecord.from_value(json_form))
    bench("from_value (CBOR form)", lambda: MessageRecord.from_value(cbor_form))
    b = bench("open_content", lambda: open_content(parsed.content, uri=URI, keyring=ring))
    bench("from_value + open_content", lambda: open_content(MessageRecord.from_value(json_form).content, uri=URI, keyring=ring))
    c = bench("from_value reply (JSON form)", lambda: MessageRecord.from_value(reply_json))
    bench("from_value reply (CBOR form)", lambda: MessageRecord.from_value(reply_cbor))
    bench("content_of (1 part)", lambda: content_of(parsed.content, uri=URI, keyring=ring))
    bench("content_of (3 parts)", lambda: content_of(sealed_three, uri=REPLY_URI, keyring=ring))
    d = bench("content_of (5 parts)", lambda: content_of(reply_content, uri=REPLY_URI, keyring=ring))
    bench("seal_content (3 parts)", lambda: seal_content(three, uri=REPLY_URI, key_id="k1", keyring=ring))
    bench("seal_content (5 parts)", lambda: seal_content(five, uri=REPLY_URI, key_id="k1", keyring=ring))
    print(f"20-message thread, estimated: {20 * (a + b) / 1000:.2f} ms (user messages only), "
          f"{10 * (a + b + c + d) / 1000:.2f} ms (10 user messages + 10 replies)")


if __name__ == "__main__":
    main()
