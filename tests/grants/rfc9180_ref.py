"""A test-only RFC 9180 reference for the one suite key grants use, written from the RFC's
pseudocode (§4, §4.1, §5.1, §5.2, §5.3, §7.1.3) on pyca primitives (X25519,
ChaCha20-Poly1305) and the standard library's HMAC-SHA256.

Base mode only, with what pyca's ``hpke.Suite`` does not offer: a given ephemeral key
(so the RFC's vectors can be replayed), an ``aad``, sequence numbers and ``Export``. It is
deliberately naive (no constant-time claims); it exists to check gelbridge's HPKE against
the RFC, never to seal anything real.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

KEM_ID: Final = 0x0020  # DHKEM(X25519, HKDF-SHA256)
KDF_ID: Final = 0x0001  # HKDF-SHA256
AEAD_ID: Final = 0x0003  # ChaCha20Poly1305
MODE_BASE: Final = 0x00

N_SECRET: Final = 32
N_SK: Final = 32
N_K: Final = 32
N_N: Final = 12
N_H: Final = 32


def i2osp(n: int, w: int) -> bytes:
    return n.to_bytes(w, "big")


KEM_SUITE_ID: Final = b"KEM" + i2osp(KEM_ID, 2)
HPKE_SUITE_ID: Final = b"HPKE" + i2osp(KEM_ID, 2) + i2osp(KDF_ID, 2) + i2osp(AEAD_ID, 2)


def extract(salt: bytes, ikm: bytes) -> bytes:
    """HKDF-Extract (RFC 5869): an empty salt is HashLen zero bytes, which HMAC pads to anyway."""
    return hmac.new(salt or bytes(N_H), ikm, hashlib.sha256).digest()


def expand(prk: bytes, info: bytes, length: int) -> bytes:
    """HKDF-Expand (RFC 5869)."""
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def labeled_extract(suite_id: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return extract(salt, b"HPKE-v1" + suite_id + label + ikm)


def labeled_expand(suite_id: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    return expand(prk, i2osp(length, 2) + b"HPKE-v1" + suite_id + label + info, length)


def _public(sk: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(sk).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _dh(sk: bytes, pk: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(sk).exchange(X25519PublicKey.from_public_bytes(pk))


def derive_key_pair(ikm: bytes) -> tuple[bytes, bytes]:
    """§7.1.3 DeriveKeyPair for X25519: (skXm, pkXm), both serialized."""
    dkp_prk = labeled_extract(KEM_SUITE_ID, b"", b"dkp_prk", ikm)
    sk = labeled_expand(KEM_SUITE_ID, dkp_prk, b"sk", b"", N_SK)
    return sk, _public(sk)


def _extract_and_expand(dh: bytes, kem_context: bytes) -> bytes:
    eae_prk = labeled_extract(KEM_SUITE_ID, b"", b"eae_prk", dh)
    return labeled_expand(KEM_SUITE_ID, eae_prk, b"shared_secret", kem_context, N_SECRET)


def encap(pk_r: bytes, sk_e: bytes) -> tuple[bytes, bytes]:
    """§4.1 Encap with a given ephemeral private key: (shared_secret, enc)."""
    enc = _public(sk_e)
    return _extract_and_expand(_dh(sk_e, pk_r), enc + pk_r), enc


def decap(enc: bytes, sk_r: bytes) -> bytes:
    """§4.1 Decap: the shared secret."""
    return _extract_and_expand(_dh(sk_r, enc), enc + _public(sk_r))


@dataclass
class Context:
    """§5.2 encryption context: key, base nonce, sequence number, exporter secret."""

    key_schedule_context: bytes
    secret: bytes
    key: bytes
    base_nonce: bytes
    exporter_secret: bytes
    seq: int = field(default=0)

    def nonce(self, seq: int) -> bytes:
        return bytes(a ^ b for a, b in zip(self.base_nonce, i2osp(seq, N_N), strict=True))

    def seal(self, aad: bytes, pt: bytes) -> bytes:
        ct = ChaCha20Poly1305(self.key).encrypt(self.nonce(self.seq), pt, aad)
        self.seq += 1
        return ct

    def open(self, aad: bytes, ct: bytes) -> bytes:
        pt = ChaCha20Poly1305(self.key).decrypt(self.nonce(self.seq), ct, aad)  # InvalidTag if not
        self.seq += 1
        return pt

    def export(self, exporter_context: bytes, length: int) -> bytes:
        """§5.3 Export."""
        return labeled_expand(HPKE_SUITE_ID, self.exporter_secret, b"sec", exporter_context, length)


def key_schedule(shared_secret: bytes, info: bytes) -> Context:
    """§5.1 KeySchedule in base mode (default psk and psk_id: empty)."""
    psk, psk_id = b"", b""
    psk_id_hash = labeled_extract(HPKE_SUITE_ID, b"", b"psk_id_hash", psk_id)
    info_hash = labeled_extract(HPKE_SUITE_ID, b"", b"info_hash", info)
    ksc = bytes([MODE_BASE]) + psk_id_hash + info_hash
    secret = labeled_extract(HPKE_SUITE_ID, shared_secret, b"secret", psk)
    return Context(
        key_schedule_context=ksc,
        secret=secret,
        key=labeled_expand(HPKE_SUITE_ID, secret, b"key", ksc, N_K),
        base_nonce=labeled_expand(HPKE_SUITE_ID, secret, b"base_nonce", ksc, N_N),
        exporter_secret=labeled_expand(HPKE_SUITE_ID, secret, b"exp", ksc, N_H),
    )


def setup_base_s(pk_r: bytes, info: bytes, sk_e: bytes) -> tuple[bytes, Context]:
    """§5.1.1 SetupBaseS with a given ephemeral key: (enc, sender context)."""
    shared_secret, enc = encap(pk_r, sk_e)
    return enc, key_schedule(shared_secret, info)


def setup_base_r(enc: bytes, sk_r: bytes, info: bytes) -> Context:
    """§5.1.1 SetupBaseR: the recipient context."""
    return key_schedule(decap(enc, sk_r), info)


def seal_single_shot(pk_r: bytes, info: bytes, aad: bytes, pt: bytes, sk_e: bytes) -> bytes:
    """§6.1 single-shot Seal, returned as ``enc ‖ ct`` (the grant's ``sealedKey`` layout)."""
    enc, ctx = setup_base_s(pk_r, info, sk_e)
    return enc + ctx.seal(aad, pt)


def open_single_shot(sealed: bytes, sk_r: bytes, info: bytes, aad: bytes = b"") -> bytes:
    """§6.1 single-shot Open of ``enc ‖ ct`` (raises InvalidTag when it does not open)."""
    return setup_base_r(sealed[:32], sk_r, info).open(aad, sealed[32:])
