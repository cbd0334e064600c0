"""The pure rules of ``gelbridge/_grants.py`` (PROTOCOL.md §6): the bridge key (kid,
fingerprint, key file, environment), which grant records are honoured and why not, the
§6.3 conflict rules, revocation, and that nothing prints key material."""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hpke_rfc9180 import _worked_example

import gelbridge._grants as grants
from gelbridge._errors import KeyringError, UnknownKeyError
from gelbridge._grants import (
    BRIDGE_KEY_ENV,
    GRANT_SCHEME,
    AccountKeys,
    BridgeKey,
    BridgeKeys,
    GrantBook,
    GrantVerdict,
    check_kid,
    default_kid,
    fingerprint,
    grant_uri,
    load_bridge_keys,
    read_grant,
    seal_key,
)
from gelbridge._records.codec import b64encode
from gelbridge._records.constants import KEY_GRANT_COLLECTION
from gelbridge._records.models import KeyGrantRecord

DID = "did:plc:unitgelbridgetestaccount2"
OTHER_DID = "did:plc:unitgelbridgeotheraccount"
RKEY, RKEY2 = "3mbd3abcdef22", "3mbd3abcdef33"  # RKEY < RKEY2
CREATED = "2026-01-01T00:00:05.000Z"
NOT_OPEN = "its sealedKey does not open for this record, keyId and recipient"
NOT_LEXICON = "it does not follow the keyGrant lexicon"

BRIDGE = BridgeKey.generate(kid="bridge-1", name="unit")
BRIDGE2 = BridgeKey.generate(kid="bridge-2")
KEYS = BridgeKeys([BRIDGE, BRIDGE2])


def sealed_for(key: bytes, *, rkey: str = RKEY, key_id: str = "conv-1", recipient: str = "bridge-1",
               did: str = DID, bridge: BridgeKey = BRIDGE) -> bytes:
    return seal_key(key, public_key=bridge.public_key, uri=grant_uri(did, rkey), key_id=key_id, recipient=recipient)


def record(sealed: Any, *, key_id: str = "conv-1", recipient: str = "bridge-1", scheme: str = GRANT_SCHEME,
           raw: bool = False) -> dict[str, Any]:
    return {"$type": KEY_GRANT_COLLECTION, "scheme": scheme, "recipient": recipient, "keyId": key_id,
            "sealedKey": sealed if raw else {"$bytes": b64encode(sealed)}, "createdAt": CREATED}


def grant(key: bytes, *, rkey: str = RKEY, key_id: str = "conv-1", did: str = DID) -> dict[str, Any]:
    """A correct grant record of ``key`` for ``key_id`` at ``did``/``rkey`` to BRIDGE."""
    return record(sealed_for(key, rkey=rkey, key_id=key_id, did=did), key_id=key_id)


def _forms(secret: bytes) -> list[str]:
    """The ways a secret could show up in text: raw repr, hex, base64 (every variant)."""
    b64 = base64.b64encode(secret).decode()
    url = base64.urlsafe_b64encode(secret).decode()
    return [repr(secret), secret.hex(), secret.hex().upper(), b64, b64.rstrip("="), url, url.rstrip("="),
            b64[:16], secret.hex()[:16]]


def assert_no_secret(texts: Iterable[str], secrets: Iterable[bytes]) -> None:
    texts, forms = list(texts), [f for s in secrets for f in _forms(s)]
    for text in texts:
        for form in forms:
            assert form not in text, f"key material {form[:8]}... in {text!r}"


def _raw_private(key: BridgeKey) -> bytes:
    return base64.b64decode(key.to_json()["privateKey"])


# --- the bridge key ---------------------------------------------------------------------------------------


def test_fingerprint_is_twelve_bytes_of_sha256_in_six_groups_of_four_hex() -> None:
    import hashlib
    import re

    for _ in range(20):
        pub = os.urandom(32)
        fp = fingerprint(pub)
        assert re.fullmatch(r"[0-9a-f]{4}(-[0-9a-f]{4}){5}", fp)
        assert fp.replace("-", "") == hashlib.sha256(pub).hexdigest()[:24]
    assert fingerprint(b"\x00" * 32) != fingerprint(b"\x00" * 31 + b"\x01")


def test_the_protocol_docs_worked_example_fingerprint() -> None:
    ex = _worked_example()
    key = BridgeKey.from_private_bytes(base64.b64decode(ex["bridgePrivateKey"] + "="), kid="bridge-1",
                                       name=ex["bridge"]["record"]["name"])
    pub = base64.b64decode(ex["bridge"]["record"]["publicKey"]["$bytes"] + "=")
    assert key.public_key == pub
    assert key.fingerprint == fingerprint(pub) == ex["bridge"]["fingerprint"] == "0f2e-87d3-931c-0076-30f9-eec8"
    assert key.is_published_by(ex["bridge"]["record"])
    assert key.record_value(ex["bridge"]["record"]["createdAt"]) == ex["bridge"]["record"]


@pytest.mark.parametrize("kid", ["a", "bridge-1", "A.b_c:d-9", "b-0123456789abcdef", "x" * 64, "...", "-"])
def test_kids_that_are_valid(kid: str) -> None:
    assert check_kid(kid) == kid
    assert BridgeKey.generate(kid=kid).kid == kid


@pytest.mark.parametrize("kid", ["", "x" * 65, ".", "..", "a/b", "a b", "bridgé", "a\n", "a#b", 7, None])
def test_kids_that_are_refused(kid: Any) -> None:
    with pytest.raises(KeyringError, match="bridge key id"):
        check_kid(kid)
    if isinstance(kid, str):
        with pytest.raises(KeyringError):
            BridgeKey.generate(kid=kid)


def test_a_key_without_kid_gets_its_fingerprints_first_eight_bytes() -> None:
    key = BridgeKey.generate()
    assert key.kid == default_kid(key.public_key) == "b-" + key.fingerprint.replace("-", "")[:16]
    assert BridgeKey.from_private_bytes(_raw_private(key)).kid == key.kid  # stable: same key, same kid


def test_bridge_name_is_at_most_64_bytes() -> None:
    assert BridgeKey.generate(kid="k", name="n" * 64).name == "n" * 64
    with pytest.raises(KeyringError, match="64 bytes"):
        BridgeKey.generate(kid="k", name="é" * 33)  # 66 bytes


def test_key_file_round_trip(tmp_path: Path) -> None:
    key = BridgeKey.generate(kid="bridge-7", name="alice's gelbridge")
    path = tmp_path / "keys" / "bridge.json"
    key.save(path)
    data = json.loads(path.read_text())
    assert set(data) == {"scheme", "kid", "name", "privateKey", "publicKey"}
    assert data["scheme"] == GRANT_SCHEME
    assert base64.b64decode(data["publicKey"]) == key.public_key
    back = BridgeKey.load(path)
    assert (back.kid, back.name, back.public_key, _raw_private(back)) == (
        key.kid, key.name, key.public_key, _raw_private(key))
    nameless = BridgeKey.generate(kid="k2")
    nameless.save(tmp_path / "n.json")
    assert "name" not in json.loads((tmp_path / "n.json").read_text())
    assert BridgeKey.load(tmp_path / "n.json").name is None


def test_key_file_is_mode_0600_from_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode is checked when the key is written (before any byte of it is), under umask 0."""
    seen: list[int] = []
    real_dump = json.dump

    def dump(obj: Any, f: Any, **kw: Any) -> None:
        seen.append(stat.S_IMODE(os.fstat(f.fileno()).st_mode))
        assert os.fstat(f.fileno()).st_size == 0
        real_dump(obj, f, **kw)

    monkeypatch.setattr(json, "dump", dump)  # _grants calls json.dump
    old = os.umask(0)
    try:
        BridgeKey.generate(kid="k").save(tmp_path / "bridge.json")
    finally:
        os.umask(old)
    assert seen == [0o600]
    assert stat.S_IMODE((tmp_path / "bridge.json").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["bridge.json"]  # no temp file left


def test_a_key_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "bridge.json"
    first = BridgeKey.generate(kid="k")
    first.save(path)
    before = path.read_bytes()
    with pytest.raises(KeyringError, match="never overwritten"):
        BridgeKey.generate(kid="k").save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["bridge.json"]
    second = BridgeKey.generate(kid="k")
    second.save(path, overwrite=True)  # only when asked
    assert BridgeKey.load(path).public_key == second.public_key != first.public_key


def test_a_key_file_that_appears_while_saving_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bridge.json"
    real_fchmod = os.fchmod

    def fchmod(fd: int, mode: int) -> None:  # another process writes the file meanwhile
        real_fchmod(fd, mode)
        path.write_text("theirs")

    monkeypatch.setattr(os, "fchmod", fchmod)  # _grants calls os.fchmod
    with pytest.raises(FileExistsError):
        BridgeKey.generate(kid="k").save(path)
    assert path.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["bridge.json"]


def test_a_damaged_key_file_is_refused(tmp_path: Path) -> None:
    key, other = BridgeKey.generate(kid="k"), BridgeKey.generate(kid="k")
    data = key.to_json()
    data["publicKey"] = other.to_json()["publicKey"]
    path = tmp_path / "bridge.json"
    path.write_text(json.dumps(data))
    with pytest.raises(KeyringError, match="damaged") as err:
        BridgeKey.load(path)
    assert_no_secret([str(err.value)], [_raw_private(key), _raw_private(other)])


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", "not valid JSON"),
    ('{"scheme": "x25519-v0", "kid": "k", "privateKey": "AAAA"}', "expected a bridge key file"),
    ('{"scheme": "hpke-x25519-v1", "kid": "k"}', "expected a bridge key file"),
    ('{"scheme": "hpke-x25519-v1", "kid": 5, "privateKey": "' + "A" * 43 + '="}', "kid and name must be strings"),
    ('{"scheme": "hpke-x25519-v1", "kid": "k", "privateKey": "not base64!"}', "not standard base64"),
    ('{"scheme": "hpke-x25519-v1", "kid": "k", "privateKey": "AAAA"}', "32 bytes, not 3"),
    ("not base64!", "not standard base64"),
    (base64.b64encode(b"\x01" * 31).decode(), "32 bytes, not 31"),
])
def test_key_texts_that_are_refused(text: str, match: str) -> None:
    with pytest.raises(KeyringError, match=match):
        BridgeKey.parse(text, source="test")


def test_a_missing_key_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="bridge-new"):
        BridgeKey.load(tmp_path / "nope.json")


def test_environment_short_form_and_full_form(tmp_path: Path) -> None:
    key = BridgeKey.generate(kid="from-file", name="n")
    short = base64.b64encode(_raw_private(key)).decode()
    keys = load_bridge_keys([], {BRIDGE_KEY_ENV: short})
    assert [k.kid for k in keys] == [default_kid(key.public_key)]
    assert keys.current is not None and keys.current.public_key == key.public_key
    keys = load_bridge_keys([], {BRIDGE_KEY_ENV: "\n " + json.dumps(key.to_json()) + "\n"})
    assert keys.current is not None
    assert (keys.current.kid, keys.current.name, keys.current.public_key) == ("from-file", "n", key.public_key)
    # the environment's key first, then the files; none when neither is given
    filed = BridgeKey.generate(kid="filed")
    filed.save(tmp_path / "b.json")
    keys = load_bridge_keys([tmp_path / "b.json"], {BRIDGE_KEY_ENV: short})
    assert [k.kid for k in keys] == [default_kid(key.public_key), "filed"]
    assert keys.by_kid("filed") is not None and keys.by_kid("nope") is None
    assert len(load_bridge_keys([], {BRIDGE_KEY_ENV: ""})) == 0
    with pytest.raises(KeyringError, match="share a kid"):
        load_bridge_keys([tmp_path / "b.json", tmp_path / "b.json"], {})


# --- which grants are honoured -------------------------------------------------------------------------------


def test_a_grant_is_honoured_in_both_bytes_forms() -> None:
    key = os.urandom(32)
    sealed = sealed_for(key)
    for value in (record(sealed), record(sealed, raw=True)):
        v = read_grant(value, did=DID, rkey=RKEY, bridge=KEYS)
        assert v == GrantVerdict(RKEY, "conv-1", None, key)
        assert v.honoured


def test_a_grant_to_the_second_bridge_key_is_honoured() -> None:
    key = os.urandom(32)
    value = record(sealed_for(key, recipient="bridge-2", bridge=BRIDGE2), recipient="bridge-2")
    assert read_grant(value, did=DID, rkey=RKEY, bridge=KEYS).key == key


def _ignored(value: Any, *, did: str = DID, rkey: str = RKEY, bridge: BridgeKeys = KEYS) -> str:
    v = read_grant(value, did=did, rkey=rkey, bridge=bridge)
    assert not v.honoured and v.key is None
    assert v.reason is not None
    return v.reason


def test_a_grant_moved_or_relabelled_is_ignored() -> None:
    key = os.urandom(32)
    sealed = sealed_for(key)
    assert _ignored(record(sealed), rkey=RKEY2) == NOT_OPEN  # copied to another record
    assert _ignored(record(sealed), did=OTHER_DID) == NOT_OPEN  # into another account
    assert _ignored(record(sealed, key_id="conv-2")) == NOT_OPEN  # relabelled keyId
    assert _ignored(record(sealed, recipient="bridge-2")) == NOT_OPEN  # relabelled to the other bridge key
    # sealed to another bridge's key that uses the same kid
    stranger = BridgeKey.generate(kid="bridge-1")
    assert _ignored(record(sealed_for(key, bridge=stranger))) == NOT_OPEN
    # to a kid this bridge does not hold
    assert _ignored(record(sealed, recipient="bridge-9")) == "its recipient is not a bridge key of this bridge"
    assert _ignored(record(sealed), bridge=BridgeKeys([])) == "its recipient is not a bridge key of this bridge"


def test_every_tampered_byte_of_sealed_key_is_ignored() -> None:
    key = os.urandom(32)
    sealed = sealed_for(key)
    assert len(sealed) == 80
    for i in range(80):  # 0-31: enc (the ephemeral public key); 32-79: ciphertext and tag
        for flip in (0x01, 0x80):
            bad = bytearray(sealed)
            bad[i] ^= flip
            assert _ignored(record(bytes(bad))) == NOT_OPEN, (i, flip)
    assert _ignored(record(bytes(32) + sealed[32:])) == NOT_OPEN  # an all-zero (low order) enc
    assert _ignored(record(sealed[:32] + bytes(48))) == NOT_OPEN


@pytest.mark.parametrize("length", [0, 32, 48, 79, 81, 96, 256])
def test_a_sealed_key_of_another_length_is_ignored(length: int) -> None:
    sealed = sealed_for(os.urandom(32))
    value = (sealed * 4)[:length]
    assert _ignored(record(value)) == NOT_OPEN


def test_a_sealed_key_that_opens_to_other_than_32_bytes_is_ignored() -> None:
    from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

    suite = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305)
    info = grants.grant_info(grant_uri(DID, RKEY), "conv-1", "bridge-1")
    pub = BRIDGE.private_key.public_key()
    for n in (0, 31, 33, 48):
        sealed = suite.encrypt(os.urandom(n), pub, info)
        assert _ignored(record(sealed)) == NOT_OPEN


def test_an_unknown_scheme_is_ignored() -> None:
    sealed = sealed_for(os.urandom(32))
    for scheme in ("hpke-x25519-v2", "", "HPKE-X25519-V1", "xchacha20poly1305-v1"):
        assert _ignored(record(sealed, scheme=scheme)) == "its scheme is not hpke-x25519-v1"


@pytest.mark.parametrize("key_id", ["", "has space", "conv/1", "convé", "a\nb", "x" * 129])
def test_a_bad_key_id_is_ignored(key_id: str) -> None:
    reason = _ignored(record(sealed_for(os.urandom(32)), key_id=key_id))
    assert reason in ("its keyId is not a valid key id", NOT_LEXICON)
    if len(key_id) <= 128:
        assert reason == "its keyId is not a valid key id"


def test_a_record_not_following_the_lexicon_is_ignored() -> None:
    good = grant(os.urandom(32))
    bad: list[Any] = [None, "text", [], {}, {**good, "$type": "chat.gel.assistant.bridge"}, {**good, "createdAt": "x"},
                      {**good, "sealedKey": "AAAA"}, {**good, "sealedKey": {"$bytes": "@@@"}},
                      {**good, "sealedKey": bytes(257)}, {**good, "recipient": "r" * 65}, {**good, "scheme": 1}]
    bad += [{k: v for k, v in good.items() if k != field} for field in ("scheme", "recipient", "keyId", "sealedKey")]
    for value in bad:
        assert _ignored(value) == NOT_LEXICON, value
    v = read_grant(None, did=DID, rkey=RKEY, bridge=KEYS)
    assert v.key_id is None


def test_no_repr_or_reason_holds_key_material() -> None:
    key, key2 = os.urandom(32), os.urandom(32)
    sealed = sealed_for(key)
    book = GrantBook(DID, KEYS, {"conv-9": key2})
    verdicts = [book.put(RKEY, record(sealed)), book.put(RKEY2, grant(key2, rkey=RKEY2, key_id="conv-1")),
                book.put("3mbd3abcdef44", grant(key, rkey="3mbd3abcdef44", key_id="conv-9")),
                read_grant(record(sealed, key_id="conv-2"), did=DID, rkey=RKEY, bridge=KEYS),
                read_grant(record(sealed, recipient="nope"), did=DID, rkey=RKEY, bridge=KEYS)]
    assert [v.honoured for v in verdicts] == [True, False, False, False, False]
    live = AccountKeys({"conv-9": key2}, book)
    model = KeyGrantRecord.from_value(record(sealed), uri=grant_uri(DID, RKEY))
    texts = [t for obj in (*verdicts, BRIDGE, BRIDGE2, KEYS, live, live.snapshot(), model)
             for t in (repr(obj), str(obj))]
    texts += [v.reason or "" for v in verdicts] + [repr(book.verdicts), str(book.verdicts)]
    assert_no_secret(texts, [key, key2, sealed, _raw_private(BRIDGE), _raw_private(BRIDGE2)])
    assert "bridge-1" in repr(BRIDGE) and BRIDGE.fingerprint in repr(BRIDGE)
    with pytest.raises(UnknownKeyError) as err:
        live["conv-404"]
    assert_no_secret([str(err.value)], [key, key2])


# --- the grants of an account (§6.3) -------------------------------------------------------------------


def test_the_smaller_record_key_wins_regardless_of_arrival_order() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    g1, g2 = grant(k1, rkey=RKEY), grant(k2, rkey=RKEY2)
    for order in ((RKEY, g1), (RKEY2, g2)), ((RKEY2, g2), (RKEY, g1)):
        book = GrantBook(DID, KEYS, {})
        for rkey, value in order:
            book.put(rkey, value)
        assert dict(book.keys) == {"conv-1": k1}
        assert book.verdicts[RKEY].honoured
        loser = book.verdicts[RKEY2]
        assert not loser.honoured and loser.key is None
        assert loser.reason == f"grant {RKEY} (a smaller record key) gives another key for its keyId"
        assert (book.honoured, book.ignored) == (1, 1)
        # deleting the winner promotes the other
        assert book.delete(RKEY)
        assert dict(book.keys) == {"conv-1": k2}
        assert book.verdicts[RKEY2].honoured and RKEY not in book.verdicts


def test_the_same_key_granted_twice_is_honoured_twice() -> None:
    key = os.urandom(32)
    book = GrantBook(DID, KEYS, {})
    assert book.put(RKEY2, grant(key, rkey=RKEY2)).honoured
    assert book.put(RKEY, grant(key, rkey=RKEY)).honoured
    assert (book.honoured, book.ignored) == (2, 0)
    assert dict(book.keys) == {"conv-1": key}
    assert book.delete(RKEY)
    assert dict(book.keys) == {"conv-1": key}  # the other grant still gives it


def test_the_operators_keyring_wins() -> None:
    mine, theirs = os.urandom(32), os.urandom(32)
    book = GrantBook(DID, KEYS, {"conv-1": mine})
    v = book.put(RKEY, grant(theirs))
    assert not v.honoured and v.reason == "the operator's keyring holds another key for its keyId"
    assert dict(book.keys) == {}
    assert AccountKeys({"conv-1": mine}, book)["conv-1"] == mine
    # a grant of the keyring's own key is honoured (it agrees)
    assert book.put(RKEY2, grant(mine, rkey=RKEY2)).honoured


def test_delete_forgets_and_a_later_update_replaces() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    book = GrantBook(DID, KEYS, {})
    book.put(RKEY, grant(k1))
    book.put(RKEY, grant(k2))  # an update of the same record
    assert dict(book.keys) == {"conv-1": k2}
    book.put(RKEY, record(b"broken"))  # an update that breaks it: the key is gone
    assert dict(book.keys) == {} and not book.verdicts[RKEY].honoured
    book.put(RKEY, grant(k1))
    assert book.delete(RKEY) is True
    assert dict(book.keys) == {} and book.verdicts == {}
    assert book.delete(RKEY) is False
    book.put(RKEY, grant(k1))
    book.put(RKEY2, grant(k2, rkey=RKEY2, key_id="conv-2"))
    book.clear()
    assert dict(book.keys) == {} and (book.honoured, book.ignored) == (0, 0)


def test_account_keys_snapshot_keeps_what_a_later_delete_removes_from_the_live_view() -> None:
    key, ring = os.urandom(32), os.urandom(32)
    book = GrantBook(DID, KEYS, {"ring-1": ring})
    live = AccountKeys({"ring-1": ring}, book)
    assert "conv-1" not in live
    book.put(RKEY, grant(key))
    assert live["conv-1"] == key  # live: no rebuild needed
    snap = live.snapshot()
    book.delete(RKEY)
    assert "conv-1" not in live
    with pytest.raises(UnknownKeyError, match="conv-1"):
        live["conv-1"]
    assert snap["conv-1"] == key and snap["ring-1"] == ring
    assert sorted(snap) == ["conv-1", "ring-1"] and len(snap) == 2
    assert sorted(live) == ["ring-1"] and len(live) == 1
    book.put(RKEY, grant(key))
    assert sorted(AccountKeys({"conv-1": ring}, book)) == ["conv-1"]  # no double count
    assert len(AccountKeys({}, None)) == 0


# --- property: book.keys is the rule applied to the final set of records ------------------------------------

RKEYS = ["3mbd3aaaaaa22", "3mbd3aaaaab22", "3mbd3aaaaac22", "3mbd3aaaaad22"]
KEY_IDS = ["conv-1", "conv-2"]
POOL = [bytes([i]) * 32 for i in range(1, 4)]
RING = {"conv-2": POOL[2]}


@cache
def _pool_grant(rkey: str, key_id: str, key_index: int, valid: bool) -> dict[str, Any]:
    value = grant(POOL[key_index], rkey=rkey, key_id=key_id)
    return value if valid else {**value, "keyId": key_id, "recipient": "bridge-2"}


def _model(final: dict[str, tuple[str, int, bool]]) -> dict[str, bytes]:
    """§6.3 from scratch: per keyId the honoured grant with the smallest rkey, unless the
    keyring has another key; the keyring's own key is taken from the grant either way."""
    out: dict[str, bytes] = {}
    for rkey in sorted(final):
        key_id, i, valid = final[rkey]
        if not valid or (key_id in RING and RING[key_id] != POOL[i]):
            continue
        out.setdefault(key_id, POOL[i])
    return out


ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(RKEYS), st.sampled_from(KEY_IDS), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(RKEYS), st.just(""), st.just(0), st.just(False)),
), max_size=12)


@settings(max_examples=150, deadline=2000, derandomize=True)
@given(ops)
def test_book_keys_equal_the_rule_applied_to_the_final_records(seq: list[tuple[str, str, str, int, bool]]) -> None:
    book = GrantBook(DID, KEYS, RING)
    final: dict[str, tuple[str, int, bool]] = {}
    for op, rkey, key_id, i, valid in seq:
        if op == "put":
            book.put(rkey, _pool_grant(rkey, key_id, i, valid))
            final[rkey] = (key_id, i, valid)
        else:
            assert book.delete(rkey) == (rkey in final)
            final.pop(rkey, None)
    want = _model(final)
    assert dict(book.keys) == want
    assert set(book.verdicts) == set(final)
    honoured = {r for r, v in book.verdicts.items() if v.honoured}
    assert honoured == {r for r, (k, i, ok) in final.items() if ok and want.get(k) == POOL[i]}
    assert book.honoured + book.ignored == len(final)
