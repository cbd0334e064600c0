"""Sealing (PROTOCOL.md §2): round trips, tamper detection, every named error, keyring."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt
from sealing_uris import OTHER, URI

from gelbridge._errors import (
    DecryptError,
    KeyringError,
    MalformedSealError,
    MovedCiphertextError,
    RecordError,
    UnknownKeyError,
    UnknownSchemeError,
)
from gelbridge._records import EncryptedContent, MessageRecord, PlainContent, TextPart
from gelbridge._sealing import (
    SCHEME,
    Keyring,
    open_blob,
    open_content,
    open_value,
    seal_blob,
    seal_content,
    seal_value,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
key_ids = st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True)
rkeys = st.from_regex(r"[A-Za-z0-9_~:-][A-Za-z0-9._~:-]{0,30}", fullmatch=True)
dids = st.from_regex(r"did:(plc|web):[a-z0-9.]{1,30}[a-z0-9]", fullmatch=True)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.dictionaries(st.text(max_size=10), json_values, max_size=5), did=dids, rkey=rkeys, key_id=key_ids)
def test_seal_open_round_trip_for_any_value_uri_and_key_id(value: dict, did: str, rkey: str, key_id: str) -> None:
    ring = Keyring()
    ring.add_new(key_id)
    uri = f"at://{did}/chat.gel.assistant.message/{rkey}"
    enc = seal_value(value, uri=uri, key_id=key_id, keyring=ring)
    assert enc.scheme == SCHEME and enc.key_id == key_id and len(enc.nonce) == 24
    assert open_value(enc, uri=uri, keyring=ring) == value
    # the record carrying it survives both wire forms
    rec = MessageRecord(conversation="c", role="user", content=enc, created_at="2026-01-01T00:00:00Z")
    again = MessageRecord.from_value(json.loads(json.dumps(rec.to_value())))
    assert open_value(again.content, uri=uri, keyring=ring) == value


@settings(max_examples=60)
@given(texts=st.lists(st.text(max_size=200), min_size=0, max_size=5))
def test_content_round_trip(ring: Keyring, texts: list[str]) -> None:
    pc = PlainContent(parts=[TextPart(text=t) for t in texts])
    enc = seal_content(pc, uri=URI, key_id="k1", keyring=ring)
    assert open_content(enc, uri=URI, keyring=ring) == pc


def test_plaintext_is_the_atproto_json_of_plain_content(ring: Keyring) -> None:
    pc = PlainContent(parts=[TextPart(text="hi")])
    enc = seal_content(pc, uri=URI, key_id="k1", keyring=ring)
    ad = f"{SCHEME}\n{URI}\nk1".encode()
    plain = crypto_aead_xchacha20poly1305_ietf_decrypt(enc.ciphertext, ad, enc.nonce, ring["k1"])
    assert json.loads(plain) == {
        "$type": "chat.gel.assistant.defs#plainContent",
        "parts": [{"$type": "chat.gel.assistant.defs#textPart", "text": "hi"}],
    }


def test_bytes_in_sealed_values_become_dollar_bytes(ring: Keyring) -> None:
    enc = seal_value({"b": b"\x01\x02"}, uri=URI, key_id="k1", keyring=ring)
    assert open_value(enc, uri=URI, keyring=ring) == {"b": {"$bytes": "AQI"}}


def test_nonces_are_fresh(ring: Keyring) -> None:
    nonces = {seal_value({}, uri=URI, key_id="k1", keyring=ring).nonce for _ in range(200)}
    assert len(nonces) == 200


def _flip(data: bytes, bit: int) -> bytes:
    b = bytearray(data)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


@settings(max_examples=200)
@given(data=st.data())
def test_any_bit_flip_in_nonce_or_ciphertext_fails(ring: Keyring, data: st.DataObject) -> None:
    enc = seal_value({"t": "hello"}, uri=URI, key_id="k1", keyring=ring)
    field = data.draw(st.sampled_from(["nonce", "ciphertext"]))
    raw = getattr(enc, field)
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    bad = enc.model_copy(update={field: _flip(raw, bit)})
    with pytest.raises(DecryptError):
        open_value(bad, uri=URI, keyring=ring)


@settings(max_examples=200)
@given(data=st.data())
def test_any_bit_flip_in_associated_data_fails(ring: Keyring, data: st.DataObject) -> None:
    ring2 = Keyring({"k1": ring["k1"], "k1x": ring["k1"]})
    enc = seal_value({"t": "hello"}, uri=URI, key_id="k1", keyring=ring2)
    what = data.draw(st.sampled_from(["uri", "key_id"]))
    if what == "uri":
        i = data.draw(st.integers(len("at://did:plc:"), len(URI) - 1))
        ch = data.draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz234567").filter(lambda c: c != URI[i]))
        uri = URI[:i] + ch + URI[i + 1 :]
        with pytest.raises((DecryptError, RecordError)):
            open_value(enc, uri=uri, keyring=ring2)
    else:
        bad = enc.model_copy(update={"key_id": "k1x"})  # same key bytes, other id → other AD
        with pytest.raises(DecryptError):
            open_value(bad, uri=URI, keyring=ring2)


def test_moved_ciphertext_names_the_record_it_belongs_to(ring: Keyring) -> None:
    enc = seal_value({"t": "x"}, uri=OTHER, key_id="k1", keyring=ring)
    with pytest.raises(MovedCiphertextError) as ei:
        open_value(enc, uri=URI, keyring=ring, candidate_uris=[URI, "at://did:plc:abc123/a.b.c/x", OTHER])
    assert OTHER in str(ei.value) and ei.value.belongs_to == OTHER
    with pytest.raises(DecryptError):
        open_value(enc, uri=URI, keyring=ring)  # without candidates it is just undecryptable


def test_wrong_key_is_a_decrypt_error(ring: Keyring) -> None:
    enc = seal_value({"t": "x"}, uri=URI, key_id="k1", keyring=ring)
    other = Keyring({"k1": ring["k2"]})
    with pytest.raises(DecryptError, match="key is wrong or the record was changed"):
        open_value(enc, uri=URI, keyring=other)


def test_unknown_scheme(ring: Keyring) -> None:
    enc = seal_value({}, uri=URI, key_id="k1", keyring=ring).model_copy(update={"scheme": "aes-gcm-v9"})
    with pytest.raises(UnknownSchemeError, match="aes-gcm-v9"):
        open_value(enc, uri=URI, keyring=ring)


def test_unknown_key_id(ring: Keyring) -> None:
    enc = seal_value({}, uri=URI, key_id="k1", keyring=ring).model_copy(update={"key_id": "nope"})
    with pytest.raises(UnknownKeyError, match="'nope' is not in the keyring"):
        open_value(enc, uri=URI, keyring=ring)
    with pytest.raises(UnknownKeyError):
        seal_value({}, uri=URI, key_id="nope", keyring=ring)


@pytest.mark.parametrize("nonce,ct,match", [(b"\x00" * 12, b"\x00" * 32, "nonce is 12 bytes"), (b"\x00" * 24, b"\x00" * 15, "shorter than the 16-byte tag")])
def test_malformed_fields(ring: Keyring, nonce: bytes, ct: bytes, match: str) -> None:
    enc = EncryptedContent(scheme=SCHEME, key_id="k1", nonce=nonce, ciphertext=ct)
    with pytest.raises(MalformedSealError, match=match):
        open_value(enc, uri=URI, keyring=ring)


def test_sealed_non_json_and_non_content_are_record_errors(ring: Keyring) -> None:
    from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_encrypt

    nonce = b"\x01" * 24
    ct = crypto_aead_xchacha20poly1305_ietf_encrypt(b"\xff not json", f"{SCHEME}\n{URI}\nk1".encode(), nonce, ring["k1"])
    with pytest.raises(RecordError, match="not UTF-8 JSON"):
        open_value(EncryptedContent(scheme=SCHEME, key_id="k1", nonce=nonce, ciphertext=ct), uri=URI, keyring=ring)
    enc = seal_value({"parts": "secret words"}, uri=URI, key_id="k1", keyring=ring)
    with pytest.raises(RecordError) as ei:
        open_content(enc, uri=URI, keyring=ring)
    assert "parts" in str(ei.value) and "secret" not in str(ei.value)


def test_seal_rejects_bad_uri_and_key_id(ring: Keyring) -> None:
    with pytest.raises(RecordError, match="AT-URI"):
        seal_value({}, uri="https://example.com", key_id="k1", keyring=ring)
    with pytest.raises(KeyringError, match="invalid keyId"):
        seal_value({}, uri=URI, key_id="bad id!", keyring=ring)


def test_error_messages_never_contain_key_or_plaintext(ring: Keyring) -> None:
    import base64

    enc = seal_value({"t": "plaintext-marker"}, uri=OTHER, key_id="k1", keyring=ring)
    key_b64 = base64.b64encode(ring["k1"]).decode()
    for exc_call in (
        lambda: open_value(enc, uri=URI, keyring=ring, candidate_uris=[OTHER]),
        lambda: open_value(enc, uri=URI, keyring=Keyring({"k1": ring["k2"]})),
    ):
        with pytest.raises(Exception) as ei:
            exc_call()
        assert "plaintext-marker" not in str(ei.value) and key_b64 not in str(ei.value)
    assert key_b64 not in repr(ring) and key_b64 not in str(ring)
    assert "plaintext" not in repr(enc)


# --- blobs -------------------------------------------------------------------------------


@settings(max_examples=50)
@given(data=st.binary(max_size=4096))
def test_blob_round_trip(ring: Keyring, data: bytes) -> None:
    body = seal_blob(data, key_id="k1", keyring=ring)
    assert len(body) == 24 + len(data) + 16
    assert open_blob(body, key_id="k1", keyring=ring) == data


def test_blob_errors(ring: Keyring) -> None:
    body = seal_blob(b"image bytes", key_id="k1", keyring=ring)
    with pytest.raises(DecryptError):
        open_blob(_flip(body, 5), key_id="k1", keyring=ring)
    with pytest.raises(DecryptError):
        open_blob(_flip(body, len(body) * 8 - 1), key_id="k1", keyring=ring)
    with pytest.raises(DecryptError):
        open_blob(body, key_id="k2", keyring=ring)
    with pytest.raises(MalformedSealError):
        open_blob(body[:39], key_id="k1", keyring=ring)
    with pytest.raises(UnknownKeyError):
        open_blob(body, key_id="zz", keyring=ring)
    # a blob body is not valid as record content and vice versa (different AD)
    enc = EncryptedContent(scheme=SCHEME, key_id="k1", nonce=body[:24], ciphertext=body[24:])
    with pytest.raises(DecryptError):
        open_value(enc, uri=URI, keyring=ring)


# --- keyring -------------------------------------------------------------------------------


def test_keyring_save_load_round_trip_with_mode_0600(tmp_path: Path) -> None:
    r = Keyring()
    kid = r.add_new()
    r.add_new("work:2026.v1")
    p = tmp_path / "sub" / "ring.json"
    r.save(p)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    loaded = Keyring.load(p)
    assert set(loaded) == {kid, "work:2026.v1"} and loaded[kid] == r[kid] and "work:2026.v1" in loaded
    assert list(tmp_path.joinpath("sub").iterdir()) == [p]  # no temp file left behind
    doc = json.loads(p.read_text())
    assert set(doc) == {"keys"}


def test_keyring_from_env(tmp_path: Path) -> None:
    r = Keyring()
    r.add_new("k")
    p = tmp_path / "ring.json"
    r.save(p)
    assert "k" in Keyring.from_env({"GELBRIDGE_KEYRING": str(p)})
    with pytest.raises(KeyringError, match="set GELBRIDGE_KEYRING"):
        Keyring.from_env({})


@pytest.mark.parametrize(
    "content,match",
    [
        ("not json", "not valid JSON"),
        ('{"k": 1}', "expected"),
        ('{"keys": {"k": "!!!"}}', "not standard base64"),
        ('{"keys": {"k": "AAAA"}}', "is 3 bytes, expected 32"),
        ('{"keys": {"bad id": "' + "A" * 43 + '="}}', "invalid keyId"),
        ('{"keys": {"k": 5}}', "base64 string"),
    ],
)
def test_bad_keyring_files(tmp_path: Path, content: str, match: str) -> None:
    p = tmp_path / "ring.json"
    p.write_text(content)
    with pytest.raises(KeyringError, match=match):
        Keyring.load(p)


def test_missing_keyring_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="gelbridge keys new"):
        Keyring.load(tmp_path / "none.json")


@pytest.mark.parametrize("kid", ["", "x" * 129, "a b", "é", "a/b"])
def test_add_new_validates_key_ids(kid: str) -> None:
    with pytest.raises(KeyringError, match="invalid keyId"):
        Keyring().add_new(kid)


def test_add_new_refuses_duplicates() -> None:
    r = Keyring()
    r.add_new("a")
    with pytest.raises(KeyringError, match="already"):
        r.add_new("a")
