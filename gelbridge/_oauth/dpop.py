"""DPoP (RFC 9449): proofs bound to a request's method and URL, and the nonces each
server hands out.

- ``htu`` is the URL without query or fragment, and must use the server's *public* URL:
  the reference PDS checks it against ``http://localhost:PORT``, not ``127.0.0.1``
  (docs/research/oauth.md §5).
- ``ath`` (the access token's hash) goes only on resource requests; the authorization
  server refuses it on PAR, token and revoke.
- Nonces are per server (origin): every answer, error or not, may carry a fresh
  ``DPoP-Nonce``; a request refused for its nonce (AS: 400 ``use_dpop_nonce``; PDS: 401
  with ``WWW-Authenticate: DPoP error="use_dpop_nonce"``) did nothing and is retried once
  with the new nonce.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from gelbridge._oauth.jose import EcKey, b64url

NONCE_HEADER = "DPoP-Nonce"


def htu_of(url: str) -> str:
    """The ``htu`` claim for a request URL: scheme, host and path (no query, no fragment)."""
    p = urlsplit(url)
    return urlunsplit((p.scheme.lower(), p.netloc.lower(), p.path or "/", "", ""))


def origin_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme.lower()}://{p.netloc.lower()}"


def access_token_hash(access_token: str) -> str:
    """The ``ath`` claim: base64url(SHA-256(token))."""
    return b64url(hashlib.sha256(access_token.encode("ascii")).digest())


def dpop_proof(key: EcKey, method: str, url: str, *, nonce: str | None = None,
               access_token: str | None = None, now: float | None = None, jti: str | None = None) -> str:
    """One DPoP proof JWT for one request (a fresh ``jti`` each time: proofs are single use)."""
    claims: dict[str, object] = {
        "jti": jti or b64url(secrets.token_bytes(16)),
        "htm": method.upper(),
        "htu": htu_of(url),
        "iat": int(now if now is not None else time.time()),
    }
    if nonce is not None:
        claims["nonce"] = nonce
    if access_token is not None:
        claims["ath"] = access_token_hash(access_token)
    return key.sign({"typ": "dpop+jwt", "jwk": key.public_jwk()}, claims)


def is_nonce_error(status: int, headers: Mapping[str, str], body: bytes) -> bool:
    """Was this answer a refusal for a missing or stale DPoP nonce (nothing was done)?"""
    if status == 401:
        challenge = headers.get("www-authenticate") or headers.get("WWW-Authenticate") or ""
        if challenge.lower().startswith("dpop") and 'error="use_dpop_nonce"' in challenge:
            return True
    if status not in (400, 401):
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("error") == "use_dpop_nonce"


class NonceBook:
    """The last nonce each server (origin) gave; read for every proof, updated from every
    answer. Bounded: a client talks to a handful of servers."""

    MAX_SERVERS = 64

    def __init__(self) -> None:
        self._nonces: dict[str, str] = {}

    def get(self, url: str) -> str | None:
        return self._nonces.get(origin_of(url))

    def seen(self, url: str, headers: Mapping[str, str]) -> bool:
        """Note the answer's nonce; True when it is new (a refused request may retry)."""
        nonce = headers.get(NONCE_HEADER) or headers.get(NONCE_HEADER.lower())
        if not nonce or len(nonce) > 512:
            return False
        origin = origin_of(url)
        if self._nonces.get(origin) == nonce:
            return False
        if origin not in self._nonces and len(self._nonces) >= self.MAX_SERVERS:
            self._nonces.pop(next(iter(self._nonces)))
        self._nonces[origin] = nonce
        return True
