"""The fast seal/open paths give exactly what the general paths give, errors included."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt, crypto_aead_xchacha20poly1305_ietf_encrypt
from sealing_uris import OTHER, URI

from gelbridge._errors import DecryptError, KeyringError, MovedCiphertextError, RecordError, UnknownKeyError
from gelbridge._records import (
    BlobRef,
    ImagePart,
    PlainContent,
    ReasoningPart,
    SourcePart,
    TextPart,
    ToolApprovalPart,
    ToolCallPart,
    ToolResultPart,
    UnknownPart,
)
from gelbridge._sealing import SCHEME, Keyring, _encrypt, content_of, open_content, open_value, seal_content, seal_value

CID = "bafyreihltcnuuyqp2jm24aqydpnlj7b6w3ogwrplomrjtg5rifv44mmjey"


def plaintext_of(enc, ring: Keyring, uri: str = URI) -> bytes:
    return crypto_aead_xchacha20poly1305_ietf_decrypt(enc.ciphertext, f"{SCHEME}\n{uri}\n{enc.key_id}".encode(), enc.nonce, ring[enc.key_id])


# built from single characters: strings at most 60 (32) code points, so <= 240 (128)
# UTF-8 bytes whatever hypothesis draws (its pool of "interesting" strings included)
texts = st.lists(st.characters(exclude_categories=("Cs",)), max_size=60).map("".join)
short = st.lists(st.characters(exclude_categories=("Cs",)), max_size=32).map("".join)
flat_parts = st.one_of(
    st.builds(TextPart, text=texts, provider_data=st.none() | texts),
    st.builds(ReasoningPart, text=st.none() | texts, provider_data=st.none() | texts),
    st.builds(ToolCallPart, call_id=texts, tool=short, input=texts, approval=st.none() | texts, source=st.none() | texts),
    st.builds(ToolResultPart, call_id=texts, output=texts, is_error=st.booleans()),
    st.builds(ToolApprovalPart, call_id=texts, approved=st.booleans(), reason=st.none() | texts),
    st.builds(SourcePart, url=st.just("https://example.com/a?b=c"), title=st.none() | texts),
)


@settings(max_examples=300)
@given(parts=st.lists(flat_parts, max_size=6))
def test_sealed_plaintext_is_orjson_of_to_value(ring: Keyring, parts: list) -> None:
    pc = PlainContent(parts=parts)
    enc = seal_content(pc, uri=URI, key_id="k1", keyring=ring)
    assert plaintext_of(enc, ring) == orjson.dumps(pc.to_value())
    assert open_content(enc, uri=URI, keyring=ring) == pc


def test_content_with_blobs_extras_and_unknown_parts_seals_as_before(ring: Keyring) -> None:
    cases = [
        PlainContent(parts=[ImagePart(image=BlobRef.of(CID, "image/png", 3), alt="a")]),
        PlainContent(parts=[ToolResultPart(call_id="c", output="o", output_blob=BlobRef.of(CID, "x/y", 1))]),
        PlainContent(parts=[UnknownPart.from_value({"$type": "x.y#z", "n": 1.5, "b": {"$bytes": "AQI"}})]),
        PlainContent.from_value({"parts": [{"$type": "chat.gel.assistant.defs#textPart", "text": "t", "future": [1, None]}]}),
        PlainContent.from_value({"parts": [], "future": {"x": 2}}),
    ]
    for pc in cases:
        enc = seal_content(pc, uri=URI, key_id="k1", keyring=ring)
        assert plaintext_of(enc, ring) == orjson.dumps(pc.to_value())
        assert open_content(enc, uri=URI, keyring=ring) == pc


@pytest.mark.parametrize(
    "pc",
    [
        PlainContent(parts=[TextPart(text="lone \ud800 surrogate")]),
        PlainContent(parts=[UnknownPart.from_value({"$type": "x.y#z", "n": 2**70})]),
    ],
)
def test_content_orjson_cannot_write_is_refused_as_before(ring: Keyring, pc: PlainContent) -> None:
    with pytest.raises(RecordError, match="cannot seal value"):
        seal_content(pc, uri=URI, key_id="k1", keyring=ring)


def test_seal_checks_uri_and_key_id_like_seal_value(ring: Keyring) -> None:
    pc = PlainContent(parts=[TextPart(text="x")])
    for bad_uri in ("https://example.com", "at://not a uri"):
        with pytest.raises(RecordError, match="AT-URI"):
            seal_content(pc, uri=bad_uri, key_id="k1", keyring=ring)
        with pytest.raises(RecordError, match="AT-URI"):  # again: failures are not cached
            seal_content(pc, uri=bad_uri, key_id="k1", keyring=ring)
    with pytest.raises(KeyringError, match="invalid keyId"):
        seal_content(pc, uri=URI, key_id="bad id!", keyring=ring)
    with pytest.raises(UnknownKeyError):
        seal_content(pc, uri=URI, key_id="nope", keyring=ring)
    plain_mapping = {"k1": ring["k1"], "bad id!": ring["k1"]}  # any Mapping still has its ids checked
    with pytest.raises(KeyringError, match="invalid keyId"):
        seal_value({}, uri=URI, key_id="bad id!", keyring=plain_mapping)
    enc = seal_content(pc, uri=URI, key_id="k1", keyring=plain_mapping)
    assert open_content(enc, uri=URI, keyring=ring) == pc


def test_raw_encrypt_matches_pynacl() -> None:
    key, nonce = bytes(range(32)), bytes(range(24))
    for n in (0, 1, 15, 16, 17, 1000):
        msg = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
        assert _encrypt(msg, b"ad", nonce, key) == crypto_aead_xchacha20poly1305_ietf_encrypt(msg, b"ad", nonce, key)


def test_open_content_errors_match_open_value(ring: Keyring) -> None:
    pc = PlainContent(parts=[TextPart(text="x")])
    enc = seal_content(pc, uri=OTHER, key_id="k1", keyring=ring)
    with pytest.raises(MovedCiphertextError) as ei:
        open_content(enc, uri=URI, keyring=ring, candidate_uris=[URI, OTHER])
    assert ei.value.belongs_to == OTHER
    with pytest.raises(DecryptError):
        open_content(enc, uri=URI, keyring=ring)
    with pytest.raises(DecryptError):
        content_of(enc, uri=URI, keyring=Keyring({"k1": ring["k2"]}))
    with pytest.raises(UnknownKeyError):
        content_of(enc.model_copy(update={"key_id": "zz"}), uri=OTHER, keyring=ring)
    with pytest.raises(KeyringError, match="no keyring"):
        content_of(enc, uri=OTHER, keyring=None)
    assert content_of(pc, uri=URI, keyring=None) is pc
    # empty plaintext and non-objects
    for value, match in ((b"", "not UTF-8 JSON"), (b"[1]", "not a JSON object"), (b"\xff", "not UTF-8 JSON")):
        nonce = bytes(24)
        ct = crypto_aead_xchacha20poly1305_ietf_encrypt(value, f"{SCHEME}\n{URI}\nk1".encode(), nonce, ring["k1"])
        sealed = enc.model_copy(update={"nonce": nonce, "ciphertext": ct})
        with pytest.raises(RecordError, match=match):
            open_content(sealed, uri=URI, keyring=ring)
        with pytest.raises(RecordError, match=match):
            open_value(sealed, uri=URI, keyring=ring)


def test_sealed_content_errors_name_the_record(ring: Keyring) -> None:
    enc = seal_value({"$type": "chat.gel.assistant.defs#plainContent", "parts": [{"$type": "chat.gel.assistant.defs#textPart"}]},
                     uri=URI, key_id="k1", keyring=ring)
    with pytest.raises(RecordError, match=rf"^record {URI} \(sealed content\): field parts\[0\]\.text: Field required$"):
        open_content(enc, uri=URI, keyring=ring)
