"""gelbridge's grant HPKE is RFC 9180's: the RFC's published vector for exactly the grant
suite, replayed by a reference written from the RFC (``rfc9180_ref``), then pyca's
``hpke.Suite`` and gelbridge's ``seal_key`` / ``open_sealed_key`` tied to that reference.

The vector: RFC 9180 Appendix A.2.1 "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
ChaCha20Poly1305 / Base Setup Information" (mode 0), with A.2.1.1 "Encryptions" and
A.2.1.2 "Exported Values". Every hex string below is copied from the RFC text as stored
in the public repository MFDI-hub/rfc9180-py, file ``rfc9180.txt`` (commit
a618bcb6f275fb16b945ad9848cfa9fd39482d83), = https://www.rfc-editor.org/rfc/rfc9180.txt
Appendix A.2.1. The RFC wraps long values over lines; they are joined here.

pyca's Suite cannot take the vector's ephemeral key or an ``aad`` (grants use none), so
the tie is: the vector's ``enc`` with a ciphertext the reference makes under the vector's
key schedule with empty ``aad`` (sequence 0) opens with ``Suite.decrypt``; what
``Suite.encrypt`` makes opens with the reference; and gelbridge's grants open both ways.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from rfc9180_ref import (
    HPKE_SUITE_ID,
    KEM_SUITE_ID,
    decap,
    derive_key_pair,
    encap,
    key_schedule,
    open_single_shot,
    seal_single_shot,
    setup_base_r,
    setup_base_s,
)

from gelbridge._grants import GRANT_SCHEME, SEALED_KEY_BYTES, grant_info, grant_uri, open_sealed_key, seal_key

H = bytes.fromhex

# --- RFC 9180 Appendix A.2.1 (Base Setup Information) ----------------------------------------
MODE = 0
KEM_ID, KDF_ID, AEAD_ID = 32, 1, 3
INFO = H("4f6465206f6e2061204772656369616e2055726e")  # "Ode on a Grecian Urn"
IKM_E = H("909a9b35d3dc4713a5e72a4da274b55d3d3821a37e5d099e74a647db583a904b")
PK_EM = H("1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a")
SK_EM = H("f4ec9b33b792c372c1d2c2063507b684ef925b8c75a42dbcbf57d63ccd381600")
IKM_R = H("1ac01f181fdf9f352797655161c58b75c656a6cc2716dcb66372da835542e1df")
PK_RM = H("4310ee97d88cc1f088a5576c77ab0cf5c3ac797f3d95139c6c84b5429c59662a")
SK_RM = H("8057991eef8f1f1af18f4a9491d16a1ce333f695d4db8e38da75975c4478e0fb")
ENC = H("1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a")
SHARED_SECRET = H("0bbe78490412b4bbea4812666f7916932b828bba79942424abb65244930d69a7")
KEY_SCHEDULE_CONTEXT = H(
    "00431df6cd95e11ff49d7013563baf7f11588c75a6611e"
    "e2a4404a49306ae4cfc5b69c5718a60cc5876c358d3f7fc31ddb598503f67be58ea1"
    "e798c0bb19eb9796"
)
SECRET = H("5b9cd775e64b437a2335cf499361b2e0d5e444d5cb41a8a53336d8fe402282c6")
KEY = H("ad2744de8e17f4ebba575b3f5f5a8fa1f69c2a07f6e7500bc60ca6e3e3ec1c91")
BASE_NONCE = H("5c4d98150661b848853b547f")
EXPORTER_SECRET = H("a3b010d4994890e2c6968a36f64470d3c824c8f5029942feb11e7a74b2921922")

# A.2.1.1 Encryptions: the same pt every time; (sequence number, aad, nonce, ct)
PT = H("4265617574792069732074727574682c20747275746820626561757479")  # "Beauty is truth, truth beauty"
ENCRYPTIONS: list[tuple[int, bytes, bytes, bytes]] = [
    (0, H("436f756e742d30"), H("5c4d98150661b848853b547f"),
     H("1c5250d8034ec2b784ba2cfd69dbdb8af406cfe3ff938e131f0def8c8b60b4db21993c62ce81883d2dd1b51a28")),
    (1, H("436f756e742d31"), H("5c4d98150661b848853b547e"),
     H("6b53c051e4199c518de79594e1c4ab18b96f081549d45ce015be002090bb119e85285337cc95ba5f59992dc98c")),
    (2, H("436f756e742d32"), H("5c4d98150661b848853b547d"),
     H("71146bd6795ccc9c49ce25dda112a48f202ad220559502cef1f34271e0cb4b02b4f10ecac6f48c32f878fae86b")),
    (4, H("436f756e742d34"), H("5c4d98150661b848853b547b"),
     H("63357a2aa291f5a4e5f27db6baa2af8cf77427c7c1a909e0b37214dd47db122bb153495ff0b02e9e54a50dbe16")),
    (255, H("436f756e742d323535"), H("5c4d98150661b848853b5480"),
     H("18ab939d63ddec9f6ac2b60d61d36a7375d2070c9b683861110757062c52b8880a5f6b3936da9cd6c23ef2a95c")),
    (256, H("436f756e742d323536"), H("5c4d98150661b848853b557f"),
     H("7a4a13e9ef23978e2c520fd4d2e757514ae160cd0cd05e556ef692370ca53076214c0c40d4c728d6ed9e727a5b")),
]

# A.2.1.2 Exported Values: (exporter_context, L, exported_value)
EXPORTS: list[tuple[bytes, int, bytes]] = [
    (b"", 32, H("4bbd6243b8bb54cec311fac9df81841b6fd61f56538a775e7c80a9f40160606e")),
    (H("00"), 32, H("8c1df14732580e5501b00f82b10a1647b40713191b7c1240ac80e2b68808ba69")),
    (H("54657374436f6e74657874"), 32, H("5acb09211139c43b3090489a9da433e8a30ee7188ba8b0a9a1ccf0c229283e53")),
]

SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305)
SK_R = X25519PrivateKey.from_private_bytes(SK_RM)
PK_R = X25519PublicKey.from_public_bytes(PK_RM)


# --- the reference reproduces every value of the vector ------------------------------------------


def test_the_suite_ids_are_the_vectors_kem_kdf_and_aead() -> None:
    assert (MODE, KEM_ID, KDF_ID, AEAD_ID) == (0, 0x0020, 0x0001, 0x0003)
    assert KEM_SUITE_ID == b"KEM\x00\x20"
    assert HPKE_SUITE_ID == b"HPKE\x00\x20\x00\x01\x00\x03"


def test_derive_key_pair_gives_the_vectors_ephemeral_and_recipient_keys() -> None:
    assert derive_key_pair(IKM_E) == (SK_EM, PK_EM)
    assert derive_key_pair(IKM_R) == (SK_RM, PK_RM)


def test_encap_with_the_vectors_ephemeral_key_gives_its_enc_and_shared_secret() -> None:
    assert encap(PK_RM, SK_EM) == (SHARED_SECRET, ENC)
    assert ENC == PK_EM  # DHKEM: enc is the serialized ephemeral public key


def test_decap_with_the_recipient_key_gives_the_same_shared_secret() -> None:
    assert decap(ENC, SK_RM) == SHARED_SECRET


def test_the_key_schedule_gives_every_derived_value() -> None:
    ctx = key_schedule(SHARED_SECRET, INFO)
    assert ctx.key_schedule_context == KEY_SCHEDULE_CONTEXT
    assert ctx.secret == SECRET
    assert ctx.key == KEY
    assert ctx.base_nonce == BASE_NONCE
    assert ctx.exporter_secret == EXPORTER_SECRET


def test_every_encryption_of_the_vector_at_its_sequence_number() -> None:
    enc, sender = setup_base_s(PK_RM, INFO, SK_EM)
    assert enc == ENC
    recipient = setup_base_r(ENC, SK_RM, INFO)
    wanted = {seq: (aad, nonce, ct) for seq, aad, nonce, ct in ENCRYPTIONS}
    seen = 0
    for seq in range(max(wanted) + 1):  # the context's own counter walks 0..256
        aad, nonce, ct = wanted.get(seq, (b"", b"", b""))
        assert sender.seq == recipient.seq == seq
        if seq in wanted:
            assert sender.nonce(seq) == nonce
            assert sender.seal(aad, PT) == ct
            assert recipient.open(aad, ct) == PT
            seen += 1
        else:
            recipient.open(b"x", sender.seal(b"x", PT))  # keeps both counters in step
    assert seen == len(ENCRYPTIONS) == 6


def test_a_vector_ciphertext_opens_only_at_its_own_sequence_number_and_aad() -> None:
    seq, aad, _nonce, ct = ENCRYPTIONS[1]
    ctx = setup_base_r(ENC, SK_RM, INFO)
    with pytest.raises(InvalidTag):
        ctx.open(aad, ct)  # at sequence 0, not 1
    ctx = setup_base_r(ENC, SK_RM, INFO)
    ctx.seq = seq
    with pytest.raises(InvalidTag):
        ctx.open(ENCRYPTIONS[0][1], ct)  # another aad
    ctx.seq = seq
    assert ctx.open(aad, ct) == PT


def test_every_exported_value() -> None:
    ctx = setup_base_r(ENC, SK_RM, INFO)
    assert [ctx.export(c, n) for c, n, _ in EXPORTS] == [v for _, _, v in EXPORTS]


# --- pyca's Suite is this HPKE (empty aad, sequence 0) -------------------------------------------------


def test_suite_decrypt_opens_the_vectors_enc_with_a_reference_ciphertext_under_empty_aad() -> None:
    ct = key_schedule(SHARED_SECRET, INFO).seal(b"", PT)  # the vector's key and base_nonce, seq 0
    assert SUITE.decrypt(ENC + ct, SK_R, INFO) == PT
    # the vector's own ciphertexts carry an aad, which the Suite never uses: they do not open
    with pytest.raises(InvalidTag):
        SUITE.decrypt(ENC + ENCRYPTIONS[0][3], SK_R, INFO)
    with pytest.raises(InvalidTag):
        SUITE.decrypt(ENC + ct, SK_R, INFO + b"!")


def test_suite_encrypt_to_the_vectors_recipient_opens_with_the_reference() -> None:
    for pt in (b"", PT, os.urandom(32), os.urandom(1000)):
        sealed = SUITE.encrypt(pt, PK_R, INFO)
        assert len(sealed) == 32 + len(pt) + 16
        assert open_single_shot(sealed, SK_RM, INFO) == pt
        with pytest.raises(InvalidTag):
            open_single_shot(sealed, SK_RM, INFO, aad=b"Count-0")


# --- gelbridge's grants are RFC 9180 single-shot seals of 32 bytes ----------------------------------

DID = "did:plc:examplegelbridgedemo2345"
URI = grant_uri(DID, "3mbd3abcdef22")


def test_seal_key_opens_with_the_reference_for_the_grants_info() -> None:
    for i in range(20):
        key, kid = os.urandom(32), f"key-{i}"
        sealed = seal_key(key, public_key=PK_RM, uri=URI, key_id=kid, recipient="bridge-1")
        assert len(sealed) == SEALED_KEY_BYTES
        info = grant_info(URI, kid, "bridge-1")
        assert info == f"{GRANT_SCHEME}\n{URI}\n{kid}\nbridge-1".encode()
        assert open_single_shot(sealed, SK_RM, info) == key
        with pytest.raises(InvalidTag):
            open_single_shot(sealed, SK_RM, grant_info(URI, kid, "bridge-2"))


def test_a_reference_sealed_grant_opens_with_open_sealed_key() -> None:
    key = os.urandom(32)
    info = grant_info(URI, "example-key-1", "bridge-1")
    # the vector's own ephemeral key: enc is the vector's, whatever the info
    sealed = seal_single_shot(PK_RM, info, b"", key, SK_EM)
    assert sealed[:32] == ENC
    assert open_sealed_key(sealed, private_key=SK_R, uri=URI, key_id="example-key-1", recipient="bridge-1") == key
    for _ in range(20):  # and fresh ephemeral keys
        sealed = seal_single_shot(PK_RM, info, b"", key, os.urandom(32))
        assert open_sealed_key(sealed, private_key=SK_R, uri=URI, key_id="example-key-1",
                               recipient="bridge-1") == key
        assert open_sealed_key(sealed, private_key=SK_R, uri=URI, key_id="example-key-2",
                               recipient="bridge-1") is None
    # with an aad it is not a grant (grants use none)
    sealed = seal_single_shot(PK_RM, info, b"aad", key, SK_EM)
    assert open_sealed_key(sealed, private_key=SK_R, uri=URI, key_id="example-key-1", recipient="bridge-1") is None


def _worked_example() -> dict[str, Any]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = text[text.index("## 6. Key grants"):]
    block = re.search(r"```json\n(.*?)\n```", section, re.S)
    assert block is not None
    data: dict[str, Any] = json.loads(block.group(1))
    return data


def _b64(s: str) -> bytes:
    return base64.b64decode(s + "=" * (-len(s) % 4))


def test_the_protocol_docs_worked_example_opens_with_the_reference() -> None:
    ex = _worked_example()
    sk = _b64(ex["bridgePrivateKey"])
    record = ex["grant"]["record"]
    sealed = _b64(record["sealedKey"]["$bytes"])
    info = grant_info(ex["grant"]["uri"], record["keyId"], record["recipient"])
    assert info == ex["grant"]["info"].encode()
    key = open_single_shot(sealed, sk, info)
    assert len(key) == 32
    assert key == open_sealed_key(sealed, private_key=X25519PrivateKey.from_private_bytes(sk), uri=ex["grant"]["uri"],
                                  key_id=record["keyId"], recipient=record["recipient"])
