"""An OAuth session as the state store keeps it: what routes it in the clear, what would
let anyone act as the bridge sealed under the operator's secret.

The row (the ``sessions`` table's JSON ``data``) holds in the clear the account's DID,
PDS, issuer and ``client_id`` (needed before anything is opened, and not secret), the
expiry, and the refresh state (``ok``, ``refreshing`` with its start, or
``reauth_needed`` with a short reason code). The access token, the refresh token and the
DPoP private key are sealed with XChaCha20-Poly1305 under a 32-byte operator secret
(``$GELBRIDGE_OAUTH_SECRET``, base64), the associated data binding the store key and the
clear routing fields: a row copied to another account or pointed at another server no
longer opens.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt, crypto_aead_xchacha20poly1305_ietf_encrypt
from nacl.exceptions import CryptoError

from gelbridge._errors import OAuthError
from gelbridge._oauth.jose import EcKey

SECRET_ENV: Final = "GELBRIDGE_OAUTH_SECRET"
SECRET_BYTES: Final = 32
_NONCE_BYTES: Final = 24
_AD_PREFIX: Final = b"gelbridge-oauth-session-v1"
KIND: Final = "oauth"

SessionState = Literal["ok", "refreshing", "reauth_needed"]


def operator_secret(env: Mapping[str, str]) -> bytes:
    """The operator secret from the environment: 32 bytes, base64 (``gelbridge oauth secret``
    would print a fresh one; ``openssl rand -base64 32`` does too)."""
    text = env.get(SECRET_ENV, "").strip()
    if not text:
        raise OAuthError(f"set ${SECRET_ENV} (32 random bytes, base64: openssl rand -base64 32): OAuth "
                         "sessions are sealed under it in the state store")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise OAuthError(f"${SECRET_ENV} is not base64") from None
    if len(raw) != SECRET_BYTES:
        raise OAuthError(f"${SECRET_ENV} must be {SECRET_BYTES} bytes, base64 (it is {len(raw)})")
    return raw


def new_secret() -> str:
    return base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


@dataclass(frozen=True)
class OAuthSession:
    """One account's OAuth session. ``repr`` never shows the tokens or the key."""

    did: str
    pds_url: str
    issuer: str
    client_id: str
    scope: str
    access_token: str
    refresh_token: str
    expires_at: float
    dpop_key: EcKey
    created_at: float
    refreshed_at: float
    assertion_kid: str | None = None
    state: SessionState = "ok"
    state_since: float | None = None
    reason: str | None = None

    def __repr__(self) -> str:
        return (f"OAuthSession(did={self.did!r}, issuer={self.issuer!r}, state={self.state!r}, "
                f"expires_at={self.expires_at:.0f})")

    def with_state(self, state: SessionState, since: float | None, reason: str | None = None) -> OAuthSession:
        return replace(self, state=state, state_since=since, reason=reason)


def _ad(account: str, clear: Mapping[str, Any]) -> bytes:
    parts = [account, str(clear["did"]), str(clear["pds"]), str(clear["issuer"]), str(clear["client_id"]),
             str(clear.get("assertion_kid") or "")]
    return _AD_PREFIX + b"".join(b"\0" + p.encode() for p in parts)


def seal_session(session: OAuthSession, *, account: str, secret: bytes) -> dict[str, Any]:
    """The store row for ``session`` under store key ``account``."""
    if len(secret) != SECRET_BYTES:
        raise OAuthError("the operator secret must be 32 bytes")
    clear: dict[str, Any] = {
        "kind": KIND, "v": 1, "did": session.did, "pds": session.pds_url, "issuer": session.issuer,
        "client_id": session.client_id, "assertion_kid": session.assertion_kid, "scope": session.scope,
        "expires_at": session.expires_at, "created_at": session.created_at, "refreshed_at": session.refreshed_at,
        "state": session.state, "state_since": session.state_since, "reason": session.reason,
    }
    inner = json.dumps({"access_token": session.access_token, "refresh_token": session.refresh_token,
                        "dpop_jwk": session.dpop_key.private_jwk()}, separators=(",", ":")).encode()
    nonce = secrets.token_bytes(_NONCE_BYTES)
    ct = crypto_aead_xchacha20poly1305_ietf_encrypt(inner, _ad(account, clear), nonce, secret)
    clear["sealed"] = base64.b64encode(nonce + ct).decode("ascii")
    return clear


def is_oauth_row(row: Mapping[str, Any] | None) -> bool:
    return row is not None and row.get("kind") == KIND


def open_session(row: Mapping[str, Any], *, account: str, secret: bytes) -> OAuthSession:
    """The session a row holds; :class:`OAuthError` when it is malformed or does not open
    (another secret, another account, a changed routing field)."""
    try:
        if row.get("kind") != KIND or row.get("v") != 1:
            raise ValueError("not an OAuth session row")
        blob = base64.b64decode(str(row["sealed"]), validate=True)
        inner = json.loads(crypto_aead_xchacha20poly1305_ietf_decrypt(
            blob[_NONCE_BYTES:], _ad(account, row), blob[:_NONCE_BYTES], secret))
        state = row.get("state", "ok")
        if state not in ("ok", "refreshing", "reauth_needed"):
            raise ValueError("unknown state")
        return OAuthSession(
            did=str(row["did"]), pds_url=str(row["pds"]), issuer=str(row["issuer"]),
            client_id=str(row["client_id"]), scope=str(row["scope"]),
            access_token=str(inner["access_token"]), refresh_token=str(inner["refresh_token"]),
            expires_at=float(row["expires_at"]), dpop_key=EcKey.from_jwk(inner["dpop_jwk"]),
            created_at=float(row["created_at"]), refreshed_at=float(row["refreshed_at"]),
            assertion_kid=row.get("assertion_kid"), state=state,
            state_since=None if row.get("state_since") is None else float(row["state_since"]),
            reason=row.get("reason"))
    except CryptoError:
        raise OAuthError(f"the stored OAuth session of {account} does not open with ${SECRET_ENV}: the secret "
                         "changed, or the row was altered or copied from another account; run "
                         "'gelbridge login' again") from None
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise OAuthError(f"the stored OAuth session of {account} is malformed ({type(e).__name__}); run "
                         "'gelbridge login' again") from None
