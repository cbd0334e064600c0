"""What key grants cost a bridge (PROTOCOL.md §6), measured side by side in one run.

Run: ``.venv/bin/python scripts/bench_grants.py [--grants=1000] [--repeats=7]``.

- **start-up**: an account with N grant records (listRecords JSON form, ``{"$bytes"}``)
  read into a ``GrantBook`` (``replace``: validate, HPKE open, settle), as a worker does
  before answering; per grant and for all N;
- **one event**: a grant created (``put``: its HPKE open, then re-deciding the grants
  that name the same keyId) and deleted (``delete``) in a book of N; a change re-decides
  only its keyId's grants, so neither grows with N (a full re-decide, the first version,
  took ~310 µs per event at N = 1000);
- **the hot path**: opening one sealed message (``open_content``) with the keyring alone
  (before: a ``Keyring``) against ``AccountKeys`` (after: keyring, then grants), key in the
  keyring and key granted; and the key a reply pins at its claim (``AccountKeys.pinned``).

Medians of ``--repeats`` runs each (interleaved). No network, no PDS: pure cost.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

from gelbridge._grants import (
    GRANT_SCHEME,
    AccountKeys,
    BridgeKey,
    BridgeKeys,
    GrantBook,
    grant_uri,
    open_sealed_key,
    seal_key,
)
from gelbridge._records import (
    KEY_GRANT_COLLECTION,
    MESSAGE_COLLECTION,
    AtUri,
    EncryptedContent,
    PlainContent,
    TextPart,
    new_tid,
    now_datetime,
)
from gelbridge._records.codec import b64encode
from gelbridge._sealing import Keyring, open_content, seal_content

DID = "did:plc:benchgrants00000000000000"


def grant_value(bridge: BridgeKey, rkey: str, key_id: str, key: bytes) -> dict[str, Any]:
    sealed = seal_key(key, public_key=bridge.public_key, uri=grant_uri(DID, rkey), key_id=key_id,
                      recipient=bridge.kid)
    return {"$type": KEY_GRANT_COLLECTION, "scheme": GRANT_SCHEME, "recipient": bridge.kid, "keyId": key_id,
            "sealedKey": {"$bytes": b64encode(sealed)}, "createdAt": now_datetime()}


def median_s(fn: Callable[[], Any], repeats: int, inner: int = 1) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        runs.append((time.perf_counter() - t0) / inner)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grants", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    n, reps = a.grants, a.repeats
    bridge = BridgeKey.generate(kid="b-bench")
    bridges = BridgeKeys([bridge])
    values = {}
    keys = {}
    for i in range(n):
        rkey, kid = new_tid(), f"k-{i}"
        keys[kid] = secrets.token_bytes(32)
        values[rkey] = grant_value(bridge, rkey, kid, keys[kid])

    def start_up() -> GrantBook:
        book = GrantBook(DID, bridges, Keyring())
        book.replace(values)
        return book

    book = start_up()
    assert book.honoured == n
    t_start = median_s(start_up, reps)
    extra_rkey = new_tid()
    extra = grant_value(bridge, extra_rkey, "k-extra", secrets.token_bytes(32))
    sealed_extra = bytes(base64.b64decode(extra["sealedKey"]["$bytes"] + "=="))

    puts, deletes = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        book.put(extra_rkey, extra)
        t1 = time.perf_counter()
        book.delete(extra_rkey)
        puts.append(t1 - t0)
        deletes.append(time.perf_counter() - t1)
    t_put, t_delete = statistics.median(puts), statistics.median(deletes)
    t_hpke = median_s(lambda: open_sealed_key(sealed_extra, private_key=bridge.private_key,
                                              uri=grant_uri(DID, extra_rkey), key_id="k-extra",
                                              recipient=bridge.kid), reps, inner=50)

    ring_key = secrets.token_bytes(32)
    ring = Keyring({"k-ring": ring_key})
    live = AccountKeys(ring, book)
    rk = new_tid()
    uri = AtUri(DID, MESSAGE_COLLECTION, rk)
    body = PlainContent(parts=[TextPart(text="hello " * 40)])
    sealed_ring = EncryptedContent.from_value(seal_content(body, uri=uri, key_id="k-ring", keyring=ring).to_value())
    granted = Keyring({"k-7": keys["k-7"]})
    sealed_granted = EncryptedContent.from_value(
        seal_content(body, uri=uri, key_id="k-7", keyring=granted).to_value())
    inner = 2000
    rows = []
    for _ in range(reps):  # interleaved: before and after under the same machine load
        rows.append((
            median_s(lambda: open_content(sealed_ring, uri=uri, keyring=ring), 1, inner),
            median_s(lambda: open_content(sealed_ring, uri=uri, keyring=live), 1, inner),
            median_s(lambda: open_content(sealed_granted, uri=uri, keyring=live), 1, inner),
            median_s(lambda: live.pinned("k-7"), 1, inner),
        ))
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(f"grants per account: {n}; medians of {reps} runs")
    print(f"start-up: read {n} grants         {t_start * 1e3:9.1f} ms   ({t_start / n * 1e6:.1f} µs per grant)")
    print(f"a grant created (book of {n})    {t_put * 1e6:9.1f} µs   (of which HPKE open {t_hpke * 1e6:.1f} µs)")
    print(f"a grant deleted (book of {n})    {t_delete * 1e6:9.1f} µs")
    print(f"open one message, Keyring (before)        {med[0] * 1e6:7.2f} µs")
    print(f"open one message, AccountKeys, keyring key {med[1] * 1e6:7.2f} µs")
    print(f"open one message, AccountKeys, granted key {med[2] * 1e6:7.2f} µs")
    print(f"the key a reply pins at its claim           {med[3] * 1e6:7.2f} µs")


if __name__ == "__main__":
    main()
