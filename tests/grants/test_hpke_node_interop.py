"""Key grants between gelbridge and an independent HPKE: ``@hpke/core`` +
``@hpke/chacha20poly1305`` in Node (``hpke_peer.mjs``), as a JS app would seal a grant.

Both ways, many keys in one Node process each (not one lucky case): what gelbridge seals
opens in Node to the same 32 bytes and only with the grant's own ``info``; what Node
seals, put into a real keyGrant record value (``{"$bytes"}`` JSON form and raw bytes, as
on the firehose), is honoured by :class:`GrantBook` with the right key, and not once
relabelled. The Node packages come with the dev PDS bundle (``scripts/pds/install.sh``);
a missing install fails loudly, never skips.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from rfc9180_ref import key_schedule
from test_hpke_rfc9180 import ENC, INFO, PT, SHARED_SECRET, SK_RM, _worked_example

from gelbridge._dev.pds import install
from gelbridge._grants import (
    GRANT_SCHEME,
    BridgeKey,
    BridgeKeys,
    GrantBook,
    grant_info,
    grant_uri,
    open_sealed_key,
    seal_key,
)
from gelbridge._records.codec import b64encode
from gelbridge._records.constants import KEY_GRANT_COLLECTION
from gelbridge._records.keys import new_tid

PEER = Path(__file__).resolve().parent / "hpke_peer.mjs"
N = 50
DID = "did:plc:interopgelbridgetest2345"
OTHER_DID = "did:plc:interopgelbridgeother234"
CREATED = "2026-01-01T00:00:05.000Z"
NODE_TIMEOUT_S = 60

Peer = Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@pytest.fixture(scope="module")
def peer() -> Peer:
    """Runs one batch of jobs in one Node process; fails (never skips) without the install."""
    rerun = "bash scripts/pds/install.sh"
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node is not on PATH (Node >= 20 is needed); then run: {rerun}", pytrace=False)
    try:
        install_dir = install(timeout=1800)
    except Exception as e:  # a test error with the reason, not a skip
        pytest.fail(f"the Node bundle (dev PDS + @hpke/core) is not installed: {e}; run: {rerun}", pytrace=False)
    for pkg in ("@hpke/core", "@hpke/chacha20poly1305"):
        if not (install_dir / "node_modules" / pkg / "package.json").is_file():
            pytest.fail(f"{pkg} is missing from {install_dir}: run: {rerun}", pytrace=False)

    def run(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        proc = subprocess.run([node, str(PEER), str(install_dir)], input=json.dumps({"jobs": list(jobs)}),
                              capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False)
        assert proc.returncode == 0, f"hpke_peer.mjs failed ({proc.returncode}): {proc.stderr[-2000:]}"
        answer = json.loads(proc.stdout)
        assert answer["versions"] == {"@hpke/core": "1.9.0", "@hpke/chacha20poly1305": "1.8.0",
                                      "@hpke/common": "1.10.1"}, answer["versions"]
        results: list[dict[str, Any]] = answer["results"]
        assert len(results) == len(jobs)
        opened = sum(1 for r in results if "key" in r)
        sealed = sum(1 for r in results if "sealedKey" in r)
        failed = sum(1 for r in results if "error" in r)
        print(f"hpke_peer.mjs ({answer['node']}, @hpke/core {answer['versions']['@hpke/core']}): "
              f"{len(jobs)} jobs: {opened} opened, {sealed} sealed, {failed} refused", file=sys.stderr)
        return results

    return run


@pytest.fixture(scope="module")
def bridge() -> BridgeKey:
    return BridgeKey.generate(kid="bridge-1", name="interop")


def _record(sealed: Any, key_id: str, recipient: str) -> dict[str, Any]:
    return {"$type": KEY_GRANT_COLLECTION, "scheme": GRANT_SCHEME, "recipient": recipient, "keyId": key_id,
            "sealedKey": sealed, "createdAt": CREATED}


def _raw_private(key: BridgeKey) -> bytes:
    return _unb64(key.to_json()["privateKey"])


# --- gelbridge seals, Node opens -----------------------------------------------------------------------


def test_grants_sealed_by_gelbridge_open_in_node_to_the_same_key(peer: Peer, bridge: BridgeKey) -> None:
    cases = [(os.urandom(32), f"conv-{i}-{os.urandom(3).hex()}", new_tid()) for i in range(N)]
    jobs = []
    for key, key_id, rkey in cases:
        uri = grant_uri(DID, rkey)
        sealed = seal_key(key, public_key=bridge.public_key, uri=uri, key_id=key_id, recipient=bridge.kid)
        jobs.append({"op": "open", "privateKey": _b64(_raw_private(bridge)), "sealedKey": _b64(sealed),
                     "info": grant_info(uri, key_id, bridge.kid).decode()})
    results = peer(jobs)
    assert [_unb64(r["key"]) for r in results] == [key for key, _, _ in cases]


def test_node_opens_a_gelbridge_grant_only_with_its_own_info(peer: Peer, bridge: BridgeKey) -> None:
    """(d): the info for another record key, account, keyId or bridge kid does not open it."""
    jobs = []
    keys = []
    for i in range(N // 5):
        key, key_id, rkey = os.urandom(32), f"conv-{i}", new_tid()
        keys.append(key)
        uri = grant_uri(DID, rkey)
        sealed_b64 = _b64(seal_key(key, public_key=bridge.public_key, uri=uri, key_id=key_id, recipient=bridge.kid))
        right = grant_info(uri, key_id, bridge.kid)
        for info in (right,  # the control: the same job with its own info opens
                     grant_info(grant_uri(DID, new_tid()), key_id, bridge.kid),
                     grant_info(grant_uri(OTHER_DID, rkey), key_id, bridge.kid),
                     grant_info(uri, key_id + "x", bridge.kid),
                     grant_info(uri, key_id, "bridge-2"),
                     right.replace(GRANT_SCHEME.encode(), b"hpke-x25519-v2")):
            jobs.append({"op": "open", "privateKey": _b64(_raw_private(bridge)), "sealedKey": sealed_b64,
                         "info": info.decode()})
    other = X25519PrivateKey.generate()  # another bridge's private key, the right info
    key, rkey = os.urandom(32), new_tid()
    sealed = seal_key(key, public_key=bridge.public_key, uri=grant_uri(DID, rkey), key_id="k", recipient=bridge.kid)
    jobs.append({"op": "open", "privateKey": _b64(_raw_private(BridgeKey("other", other))), "sealedKey": _b64(sealed),
                 "info": grant_info(grant_uri(DID, rkey), "k", bridge.kid).decode()})
    results = peer(jobs)
    controls, refused = results[:-1][::6], [r for i, r in enumerate(results[:-1]) if i % 6] + results[-1:]
    assert [_unb64(r["key"]) for r in controls] == keys
    # refused by the AEAD (not a malformed job): the tag does not verify under that context
    assert [r.get("error") for r in refused] == ["OpenError: invalid tag"] * (5 * (N // 5) + 1), refused


# --- Node seals, gelbridge honours ---------------------------------------------------------------------


def _node_grants(peer: Peer, bridge: BridgeKey, n: int, did: str = DID) -> list[tuple[bytes, str, str, bytes]]:
    """n grants sealed in Node to ``bridge``: (key, keyId, rkey, sealedKey)."""
    cases = [(os.urandom(32), f"conv-{i}-{os.urandom(3).hex()}", new_tid()) for i in range(n)]
    jobs = [{"op": "seal", "publicKey": _b64(bridge.public_key), "key": _b64(key),
             "info": grant_info(grant_uri(did, rkey), key_id, bridge.kid).decode()} for key, key_id, rkey in cases]
    results = peer(jobs)
    out = []
    for (key, key_id, rkey), r in zip(cases, results, strict=True):
        sealed = _unb64(r["sealedKey"])
        assert len(sealed) == 80
        out.append((key, key_id, rkey, sealed))
    return out


def test_grants_sealed_in_node_are_honoured_in_both_record_forms(peer: Peer, bridge: BridgeKey) -> None:
    grants = _node_grants(peer, bridge, N)
    for form in ("$bytes", "raw"):
        book = GrantBook(DID, BridgeKeys([bridge]), {})
        for key, key_id, rkey, sealed in grants:
            value = _record({"$bytes": b64encode(sealed)} if form == "$bytes" else sealed, key_id, bridge.kid)
            verdict = book.put(rkey, value)
            assert verdict.honoured, (form, verdict)
            assert verdict.key_id == key_id and verdict.key == key
        assert dict(book.keys) == {key_id: key for key, key_id, _, _ in grants}
        assert (book.honoured, book.ignored) == (N, 0)
        for key, key_id, rkey, sealed in grants:  # and the plain open agrees
            assert open_sealed_key(sealed, private_key=bridge.private_key, uri=grant_uri(DID, rkey),
                                   key_id=key_id, recipient=bridge.kid) == key


def test_a_node_grant_relabelled_is_not_honoured(peer: Peer, bridge: BridgeKey) -> None:
    """(c): moved to another rkey or account, relabelled keyId or recipient, or sealed
    with the info of another place: ignored with a reason."""
    second = BridgeKey.generate(kid="bridge-2")
    keys = BridgeKeys([bridge, second])
    grants = _node_grants(peer, bridge, N // 5)
    # sealed in Node with the info of another keyId, but labelled with this one
    wrong_info = peer([{"op": "seal", "publicKey": _b64(bridge.public_key), "key": _b64(key),
                        "info": grant_info(grant_uri(DID, rkey), key_id + "-other", bridge.kid).decode()}
                       for key, key_id, rkey, _ in grants])
    for (_key, key_id, rkey, sealed), w in zip(grants, wrong_info, strict=True):
        b = {"$bytes": b64encode(sealed)}
        cases = [
            (GrantBook(DID, keys, {}), new_tid(), _record(b, key_id, bridge.kid)),  # another rkey
            (GrantBook(OTHER_DID, keys, {}), rkey, _record(b, key_id, bridge.kid)),  # another account
            (GrantBook(DID, keys, {}), rkey, _record(b, key_id + "x", bridge.kid)),  # relabelled keyId
            (GrantBook(DID, keys, {}), rkey, _record(b, key_id, second.kid)),  # relabelled recipient
            (GrantBook(DID, keys, {}), rkey, _record({"$bytes": w["sealedKey"]}, key_id, bridge.kid)),
        ]
        for book, where, value in cases:
            verdict = book.put(where, value)
            assert not verdict.honoured and verdict.key is None
            assert verdict.reason == "its sealedKey does not open for this record, keyId and recipient"
            assert dict(book.keys) == {}
        # the same grant, in its own place, is honoured: the cases differ only by the relabelling
        book = GrantBook(DID, keys, {})
        assert book.put(rkey, _record(b, key_id, bridge.kid)).honoured


# --- both agree on the RFC and on the docs ----------------------------------------------------------------


def test_the_protocol_docs_worked_example_opens_in_node(peer: Peer) -> None:
    ex = _worked_example()
    record = ex["grant"]["record"]
    sk = _unb64(ex["bridgePrivateKey"])
    results = peer([{"op": "open", "privateKey": _b64(sk), "sealedKey": record["sealedKey"]["$bytes"],
                     "info": ex["grant"]["info"]}])
    key = open_sealed_key(_unb64(record["sealedKey"]["$bytes"]), private_key=X25519PrivateKey.from_private_bytes(sk),
                          uri=ex["grant"]["uri"], key_id=record["keyId"], recipient=record["recipient"])
    assert key is not None and _unb64(results[0]["key"]) == key


def test_node_opens_the_rfc_vectors_enc_with_a_reference_ciphertext(peer: Peer) -> None:
    """RFC 9180 A.2.1: the vector's enc with a ciphertext under its key schedule (empty
    aad, sequence 0) opens in Node with the vector's skRm and info, as with pyca."""
    ct = key_schedule(SHARED_SECRET, INFO).seal(b"", PT)
    info = INFO.decode()  # "Ode on a Grecian Urn": ASCII, so the UTF-8 info is the vector's bytes
    results = peer([{"op": "open", "privateKey": _b64(SK_RM), "sealedKey": _b64(ENC + ct), "info": info},
                    {"op": "open", "privateKey": _b64(SK_RM), "sealedKey": _b64(ENC + ct), "info": info + "!"}])
    assert _unb64(results[0]["key"]) == PT
    assert results[1] == {"error": "OpenError: invalid tag"}
