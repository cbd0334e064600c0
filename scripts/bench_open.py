"""``gelbridge open`` on record files where nothing opens: before/after of the copy search.

Run: ``.venv/bin/python scripts/bench_open.py [--sizes=500,1000,2000,3000] [--repeats=3]``.

Two files per size N: N messages sealed with a key the keyring holds under the same
keyId but with other bytes ("wrong key"), and N messages whose ciphertext was copied
from another record of the file ("moved": N/2 originals, N/2 copies). Each is opened as
the CLI does (``cli.records.open_file``) two ways, in one run, alternating:

- ``uri list`` (before): every failing record is tried against every other URI of the
  file (what ``open_file`` passed as ``candidate_uris`` until now): quadratic;
- ``copy index`` (after): ``sealing.CopySources``, the records holding the same nonce:
  linear.

Prints the median seconds of ``--repeats`` runs of each, and checks both report the
same error (type and text) for every record.
"""

from __future__ import annotations

import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gelbridge._cli import records as cli_records
from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
from gelbridge._records.io import load_records
from gelbridge._sealing import Keyring, open_record, seal_content

DID = "did:plc:benchopen0000000000000"


def _message(uri: AtUri, content: dict[str, Any]) -> dict[str, Any]:
    return {"uri": str(uri), "cid": None, "value": {
        "$type": MESSAGE_COLLECTION, "conversation": "3mconv", "role": "user", "createdAt": now_datetime(),
        "content": content}}


def make_files(n: int, tmp: Path) -> tuple[Path, Path, Keyring, Keyring]:
    """The two files, the keyring that sealed them and one with the wrong key."""
    sealer = Keyring()
    kid = sealer.add_new("k-bench")
    wrong = Keyring({kid: secrets.token_bytes(32)})  # same keyId, other key
    wrong_recs, moved_recs = [], []
    originals: list[dict[str, Any]] = []
    for i in range(n):
        uri = AtUri(DID, MESSAGE_COLLECTION, new_tid())
        enc = seal_content(PlainContent(parts=[TextPart(text=f"message {i}")]), uri=uri, key_id=kid,
                           keyring=sealer).to_value()
        wrong_recs.append(_message(uri, enc))
        if i < n // 2:
            originals.append(enc)
            moved_recs.append(_message(uri, enc))
        else:
            moved_recs.append(_message(uri, originals[i - n // 2]))  # a copy of another record's
    w, m = tmp / f"wrong-{n}.json", tmp / f"moved-{n}.json"
    w.write_text(json.dumps({"records": wrong_recs}))
    m.write_text(json.dumps({"records": moved_recs}))
    return w, m, sealer, wrong


def open_with_uri_list(path: Path, keyring: Keyring) -> list[str]:
    entries = load_records(path)
    uris = [e.uri for e in entries]
    return [_err(open_record(e.uri, e.cid, e.value, keyring=keyring, candidate_uris=uris)) for e in entries]


def open_with_index(path: Path, keyring: Keyring) -> list[str]:
    return [_err(r) for r in cli_records.open_file(path, keyring)]


def _err(r: Any) -> str:
    return f"{type(r.error).__name__}: {r.error}" if r.error is not None else "opened"


def main() -> None:
    sizes = [500, 1000, 2000, 3000]
    repeats = 3
    for arg in sys.argv[1:]:
        if arg.startswith("--sizes="):
            sizes = [int(x) for x in arg.split("=", 1)[1].split(",")]
        elif arg.startswith("--repeats="):
            repeats = int(arg.split("=", 1)[1])
    print(f"{'file':>12} {'records':>8} {'uri list (before) s':>20} {'copy index (after) s':>21}")
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            wrong_file, moved_file, sealer, wrong = make_files(n, Path(d))
            for label, path, ring in (("wrong key", wrong_file, wrong), ("moved", moved_file, sealer)):
                before: list[float] = []
                after: list[float] = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    a = open_with_uri_list(path, ring)
                    before.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    b = open_with_index(path, ring)
                    after.append(time.perf_counter() - t0)
                    assert a == b, "the two ways must report the same errors"
                print(f"{label:>12} {n:>8} {statistics.median(before):>20.3f} {statistics.median(after):>21.3f}")


if __name__ == "__main__":
    main()
