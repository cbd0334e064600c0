"""ES256 keys, compact JWS and PKCE: the JOSE that atproto OAuth needs, on pyca
``cryptography`` (no JOSE library: the surface is small and fixed).

- DPoP proofs (RFC 9449) and ``private_key_jwt`` client assertions (RFC 7523) are compact
  JWS signed with ES256 (P-256, SHA-256); the signature is raw ``r || s``, 32 bytes each
  (RFC 7518 §3.4), not DER.
- A JWK thumbprint (RFC 7638) names a public key: the ``jkt`` a DPoP-bound token is bound to.
- PKCE S256 (RFC 7636): the verifier stays here, its hash goes in the authorization request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from gelbridge._errors import OAuthError

_P256_BYTES = 32


def b64url(data: bytes) -> str:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    if not isinstance(text, str) or not text or "=" in text:
        raise ValueError("not unpadded base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _int_bytes(n: int) -> bytes:
    return n.to_bytes(_P256_BYTES, "big")


@dataclass(frozen=True)
class EcKey:
    """A P-256 private key for ES256 (a DPoP key or a client-assertion key).

    ``kid``: the key id a client assertion names (the JWKS entry); DPoP keys need none.
    ``repr`` never shows the private scalar."""

    private: ec.EllipticCurvePrivateKey
    kid: str | None = None

    def __repr__(self) -> str:
        return f"EcKey(kid={self.kid!r}, jkt={self.thumbprint()!r})"

    @classmethod
    def generate(cls, kid: str | None = None) -> EcKey:
        return cls(ec.generate_private_key(ec.SECP256R1()), kid)

    def public_jwk(self) -> dict[str, str]:
        """The public key as a JWK (``kid``, ``alg`` and ``use`` added when it has a kid:
        the JWKS form a client's metadata publishes)."""
        nums = self.private.public_key().public_numbers()
        jwk = {"kty": "EC", "crv": "P-256", "x": b64url(_int_bytes(nums.x)), "y": b64url(_int_bytes(nums.y))}
        if self.kid is not None:
            jwk.update(kid=self.kid, alg="ES256", use="sig")
        return jwk

    def private_jwk(self) -> dict[str, str]:
        """The private key as a JWK: a secret (sealed at rest, never logged)."""
        d = self.private.private_numbers().private_value
        return {**self.public_jwk(), "d": b64url(_int_bytes(d))}

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any]) -> EcKey:
        """A private P-256 JWK back into a key; the public half must match ``d``."""
        try:
            if jwk.get("kty") != "EC" or jwk.get("crv") != "P-256":
                raise ValueError("not an EC P-256 key")
            d = int.from_bytes(b64url_decode(str(jwk["d"])), "big")
            key = ec.derive_private_key(d, ec.SECP256R1())
        except (KeyError, ValueError, TypeError) as e:
            raise OAuthError(f"not a P-256 private JWK ({e})") from None
        kid = jwk.get("kid")
        out = cls(key, kid if isinstance(kid, str) else None)
        pub = out.public_jwk()
        if "x" in jwk and (jwk.get("x"), jwk.get("y")) != (pub["x"], pub["y"]):
            raise OAuthError("the JWK's public half (x, y) does not belong to its private key (d)")
        return out

    def thumbprint(self) -> str:
        """RFC 7638 thumbprint of the public key (the DPoP ``jkt``)."""
        return jwk_thumbprint(self.public_jwk())

    def sign(self, header: Mapping[str, Any], claims: Mapping[str, Any]) -> str:
        """A compact JWS of ``claims``, ``alg`` ES256 (set here, whatever ``header`` says)."""
        h = {**header, "alg": "ES256"}
        signing_input = f"{_segment(h)}.{_segment(claims)}".encode("ascii")
        r, s = decode_dss_signature(self.private.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        return f"{signing_input.decode('ascii')}.{b64url(_int_bytes(r) + _int_bytes(s))}"


def _segment(obj: Mapping[str, Any]) -> str:
    return b64url(json.dumps(obj, separators=(",", ":"), sort_keys=True).encode())


def jwk_thumbprint(jwk: Mapping[str, Any]) -> str:
    """RFC 7638: SHA-256 over the required members in lexicographic order, no whitespace."""
    if jwk.get("kty") != "EC":
        raise OAuthError("only EC keys are thumbprinted here")
    canon = json.dumps({k: jwk[k] for k in ("crv", "kty", "x", "y")}, separators=(",", ":"), sort_keys=True)
    return b64url(hashlib.sha256(canon.encode()).digest())


def verify_es256(token: str, public_jwk: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(header, claims)`` of a compact ES256 JWS signed by ``public_jwk``; raises
    :class:`OAuthError` otherwise. (Tests and the offline check of a stored key use it.)"""
    try:
        h64, c64, s64 = token.split(".")
        header, claims = json.loads(b64url_decode(h64)), json.loads(b64url_decode(c64))
        sig = b64url_decode(s64)
        if header.get("alg") != "ES256" or len(sig) != 2 * _P256_BYTES:
            raise ValueError("not ES256")
        nums = ec.EllipticCurvePublicNumbers(int.from_bytes(b64url_decode(public_jwk["x"]), "big"),
                                             int.from_bytes(b64url_decode(public_jwk["y"]), "big"), ec.SECP256R1())
        der = encode_dss_signature(int.from_bytes(sig[:_P256_BYTES], "big"), int.from_bytes(sig[_P256_BYTES:], "big"))
        nums.public_key().verify(der, f"{h64}.{c64}".encode("ascii"), ec.ECDSA(hashes.SHA256()))
    except Exception as e:  # noqa: BLE001 - every way a token can be wrong is one answer
        raise OAuthError(f"not a valid ES256 JWS for this key ({type(e).__name__})") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise OAuthError("a JWS header and claims must be JSON objects")
    return header, claims


def pkce_challenge(verifier: str) -> str:
    """S256 code challenge of a PKCE verifier (RFC 7636 §4.2)."""
    return b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def pkce_pair() -> tuple[str, str]:
    """A fresh ``(verifier, challenge)``: 43 characters of 32 random bytes (RFC 7636 §4.1)."""
    verifier = b64url(secrets.token_bytes(32))
    return verifier, pkce_challenge(verifier)
