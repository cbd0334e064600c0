"""Cost of reading one typical sealed message: ``from_value`` + ``open_content``.

Run: ``.venv/bin/python scripts/bench_records.py``. Prints the median per call (µs)
of several repeats, for the JSON form (XRPC) and the CBOR form (firehose/CAR).
"""

from __future__ import annotations

import json
import statistics
import timeit

import libipld

from gelbridge.records import GenerationRequest, MessageRecord, PlainContent, TextPart
from gelbridge.sealing import Keyring, open_content, seal_content

URI = "at://did:plc:examplegelbridgedemo2345/chat.gel.assistant.message/3mabcdefghij2"


def main() -> None:
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
    cbor_form = libipld.decode_dag_cbor(libipld.encode_dag_cbor({**json_form, "content": {**json_form["content"], "nonce": content.nonce, "ciphertext": content.ciphertext}}))
    parsed = MessageRecord.from_value(json_form)

    def bench(name: str, fn: object, n: int = 2000) -> float:
        per = [t / n * 1e6 for t in timeit.repeat(fn, number=n, repeat=7)]  # type: ignore[arg-type]
        med = statistics.median(per)
        print(f"{name:<40} {med:8.1f} µs  (min {min(per):.1f})")
        return med

    a = bench("from_value (JSON form)", lambda: MessageRecord.from_value(json_form))
    bench("from_value (CBOR form)", lambda: MessageRecord.from_value(cbor_form))
    b = bench("open_content", lambda: open_content(parsed.content, uri=URI, keyring=ring))
    bench("from_value + open_content", lambda: open_content(MessageRecord.from_value(json_form).content, uri=URI, keyring=ring))
    print(f"20-message thread, estimated: {20 * (a + b) / 1000:.2f} ms")


if __name__ == "__main__":
    main()
