"""Finding where a sealed value that does not open was copied from, in linear time:
the same errors as trying every other record of the set, one decryption at most extra."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

import gelbridge._sealing as sealing
from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
from gelbridge._sealing import CopySources, Keyring, open_record, seal_content

DID = "did:plc:copysources00000000000"


def records(n: int, ring: Keyring, kid: str) -> list[tuple[AtUri, dict[str, Any]]]:
    out = []
    originals: list[dict[str, Any]] = []
    for i in range(n):
        uri = AtUri(DID, MESSAGE_COLLECTION, new_tid())
        enc = seal_content(PlainContent(parts=[TextPart(text=f"m{i}")]), uri=uri, key_id=kid, keyring=ring).to_value()
        if i % 3 == 2:  # every third is a copy of an earlier record's content
            enc = originals[i // 3]
        originals.append(enc)
        out.append((uri, {"$type": MESSAGE_COLLECTION, "conversation": "c", "role": "user",
                          "createdAt": now_datetime(), "content": enc}))
    return out


@pytest.mark.parametrize("wrong_key", [False, True])
def test_the_copy_index_reports_what_trying_every_record_reports_with_linear_work(
    wrong_key: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = Keyring()
    kid = ring.add_new("k1")
    recs = records(60, ring, kid)
    opener = Keyring({kid: secrets.token_bytes(32)}) if wrong_key else ring
    uris = [u for u, _ in recs]
    tries = {"n": 0}
    real = sealing._try_open

    def counted(*a: Any) -> Any:
        tries["n"] += 1
        return real(*a)

    monkeypatch.setattr(sealing, "_try_open", counted)

    def report(cands: Any) -> list[str]:
        return [f"{type(r.error).__name__}: {r.error}" if r.error else "opened"
                for r in (open_record(u, None, v, keyring=opener, candidate_uris=cands) for u, v in recs)]

    before = report(uris)
    quadratic = tries["n"]
    tries["n"] = 0
    after = report(CopySources(recs))
    assert after == before
    assert any("MovedCiphertextError" in e for e in after) != wrong_key  # copies found with the right key
    # each record: one decryption for itself, at most one per record sharing its nonce
    assert tries["n"] <= 2 * len(recs) < quadratic


def test_nonces_in_either_form_are_indexed() -> None:
    enc = {"nonce": {"$bytes": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYX"}}
    raw = {"nonce": bytes(range(24))}
    idx = CopySources([("at://a/x/1", {"content": enc}), ("at://a/x/2", {"instructions": raw}),
                       ("at://a/x/3", {"content": {"nonce": {"$bytes": "not base64!"}}}), ("at://a/x/4", {})])
    assert idx._by_nonce == {bytes(range(24)): ["at://a/x/1", "at://a/x/2"]}
