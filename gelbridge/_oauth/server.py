"""The authorization server's side of atproto OAuth, over HTTP: discovery, the pushed
authorization request, the code exchange, refresh and revocation, each DPoP-signed and
retried once for a nonce (nothing was done by a nonce refusal, so the retry is safe).

Refresh tokens are single use and the reference PDS deletes the whole session when one is
replayed (docs/research/oauth.md §6): :meth:`OAuthClient.refresh` never resends one. A
request whose answer was lost raises :class:`RefreshOutcomeUnknown`; the caller must not
try that token again (the account needs a new ``gelbridge login``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

from gelbridge._config import is_loopback_host
from gelbridge._errors import OAuthError
from gelbridge._oauth.dpop import NonceBook, dpop_proof, is_nonce_error
from gelbridge._oauth.jose import EcKey
from gelbridge._oauth.scopes import check_granted

#: ``invalid_grant`` descriptions after which the session is gone for good (re-login)
_SESSION_GONE = ("replayed", "invalid refresh token", "expired", "does not match", "different key")


class SessionGone(OAuthError):
    """The server no longer has this session (revoked, expired, replayed, key mismatch):
    only a new ``gelbridge login`` helps."""


class ServerUnreachable(OAuthError):
    """The request never reached the authorization server (nothing was spent): retry later."""


class RefreshOutcomeUnknown(OAuthError):
    """A refresh was sent and its answer lost: the token may be spent; never resend it."""


def check_server_url(url: str, *, allow_loopback_http: bool) -> str:
    """An authorization server or PDS URL: https, or http on loopback in dev/test mode only."""
    p = urlsplit(url)
    if p.scheme == "https" and p.hostname:
        return url.rstrip("/")
    if p.scheme == "http" and is_loopback_host(p.hostname) and allow_loopback_http:
        return url.rstrip("/")
    raise OAuthError(f"{url!r} is not an https URL (http is accepted only on loopback, in dev mode)")


@dataclass(frozen=True)
class AuthServer:
    """The endpoints of one authorization server, from its metadata (RFC 8414)."""

    issuer: str
    par_endpoint: str
    authorization_endpoint: str
    token_endpoint: str
    revocation_endpoint: str | None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], *, issuer: str, allow_loopback_http: bool) -> AuthServer:
        if meta.get("issuer") != issuer:
            raise OAuthError(f"the authorization server's metadata names issuer {meta.get('issuer')!r}, "
                             f"not {issuer!r}: refusing it")
        if "S256" not in (meta.get("code_challenge_methods_supported") or []):
            raise OAuthError("the authorization server does not support PKCE S256")
        if "ES256" not in (meta.get("dpop_signing_alg_values_supported") or []):
            raise OAuthError("the authorization server does not support ES256 DPoP proofs")

        def url(key: str) -> str:
            v = meta.get(key)
            if not isinstance(v, str):
                raise OAuthError(f"the authorization server's metadata has no {key}")
            return check_server_url(v, allow_loopback_http=allow_loopback_http)

        rev = meta.get("revocation_endpoint")
        return cls(issuer, url("pushed_authorization_request_endpoint"), url("authorization_endpoint"),
                   url("token_endpoint"), url("revocation_endpoint") if isinstance(rev, str) else None)


async def discover(http: httpx.AsyncClient, pds_url: str, *, allow_loopback_http: bool = False) -> AuthServer:
    """The authorization server of a PDS: its protected-resource metadata names the issuer,
    whose own metadata must name itself the same."""
    pds = check_server_url(pds_url, allow_loopback_http=allow_loopback_http)
    pr = await _get_json(http, f"{pds}/.well-known/oauth-protected-resource")
    servers = pr.get("authorization_servers")
    if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
        raise OAuthError(f"the PDS at {pds} names no authorization server: it does not support OAuth")
    issuer = check_server_url(servers[0], allow_loopback_http=allow_loopback_http)
    meta = await _get_json(http, f"{issuer}/.well-known/oauth-authorization-server")
    return AuthServer.from_metadata(meta, issuer=issuer, allow_loopback_http=allow_loopback_http)


async def _get_json(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    try:
        resp = await http.get(url, follow_redirects=False)
    except httpx.TransportError as e:
        raise OAuthError(f"cannot reach {url} ({type(e).__name__})") from None
    if resp.status_code != 200:
        raise OAuthError(f"{url} answered HTTP {resp.status_code}")
    try:
        data = resp.json()
    except ValueError:
        raise OAuthError(f"{url} did not answer JSON") from None
    if not isinstance(data, dict):
        raise OAuthError(f"{url} did not answer a JSON object")
    return data


@dataclass(frozen=True)
class TokenSet:
    """A token response: ``expires_at`` from its ``expires_in`` (never a built-in lifetime)."""

    access_token: str
    refresh_token: str
    sub: str
    scope: str
    expires_at: float


class OAuthClient:
    """One client (``client_id``) talking to one authorization server with one DPoP key.

    ``assertion_key``: a confidential client's signing key (``private_key_jwt``); None for
    a public (loopback) client."""

    def __init__(self, http: httpx.AsyncClient, server: AuthServer, client_id: str, dpop_key: EcKey, *,
                 assertion_key: EcKey | None = None, nonces: NonceBook | None = None) -> None:
        if assertion_key is not None and assertion_key.kid is None:
            raise OAuthError("a client assertion key needs its kid (the JWKS entry it is published as)")
        self.http, self.server, self.client_id, self.dpop_key = http, server, client_id, dpop_key
        self.assertion_key = assertion_key
        self.nonces = nonces or NonceBook()

    def _client_auth(self, now: float) -> dict[str, str]:
        if self.assertion_key is None:
            return {"client_id": self.client_id}
        assertion = self.assertion_key.sign(
            {"typ": "JWT", "kid": self.assertion_key.kid},
            {"iss": self.client_id, "sub": self.client_id, "aud": self.server.issuer,
             "jti": secrets.token_urlsafe(16), "iat": int(now), "exp": int(now) + 60})
        return {"client_id": self.client_id, "client_assertion": assertion,
                "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"}

    async def _post(self, url: str, form: Mapping[str, str]) -> httpx.Response:
        """POST a form with a DPoP proof; once more with the server's new nonce if refused for it."""
        for _ in range(2):
            now = time.time()
            proof = dpop_proof(self.dpop_key, "POST", url, nonce=self.nonces.get(url), now=now)
            resp = await self.http.post(url, data={**form, **self._client_auth(now)}, headers={"DPoP": proof})
            fresh = self.nonces.seen(url, resp.headers)
            if not (is_nonce_error(resp.status_code, resp.headers, resp.content) and fresh):
                return resp
        return resp

    async def push_authorization(self, *, redirect_uri: str, scope: str, state: str, code_challenge: str,
                                 login_hint: str | None = None) -> str:
        """PAR: the ``request_uri`` the browser's authorization URL names."""
        form = {"response_type": "code", "redirect_uri": redirect_uri, "scope": scope, "state": state,
                "code_challenge": code_challenge, "code_challenge_method": "S256"}
        if login_hint:
            form["login_hint"] = login_hint
        resp = await self._send(self.server.par_endpoint, form, "the pushed authorization request")
        body = _json_object(resp)
        if resp.status_code not in (200, 201) or not isinstance(body.get("request_uri"), str):
            raise _refusal(resp, body, "the pushed authorization request")
        return str(body["request_uri"])

    def authorization_url(self, request_uri: str) -> str:
        return f"{self.server.authorization_endpoint}?" + urlencode(
            {"client_id": self.client_id, "request_uri": request_uri})

    async def exchange_code(self, *, code: str, redirect_uri: str, code_verifier: str, scope: str) -> TokenSet:
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "code_verifier": code_verifier}
        resp = await self._send(self.server.token_endpoint, form, "the code exchange")
        return self._tokens(resp, scope, "the code exchange")

    async def refresh(self, refresh_token: str, *, scope: str) -> TokenSet:
        """One refresh. Sent at most once per token: a lost answer is
        :class:`RefreshOutcomeUnknown`, a dead session :class:`SessionGone`."""
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        try:
            resp = await self._post(self.server.token_endpoint, form)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never left: the token is unspent
            raise ServerUnreachable(f"cannot reach the authorization server ({type(e).__name__})") from None
        except httpx.TransportError as e:
            raise RefreshOutcomeUnknown(
                f"the refresh request was sent and its answer lost ({type(e).__name__}): the refresh token may "
                "be spent, and resending it would end the session; run 'gelbridge login' again") from None
        return self._tokens(resp, scope, "the refresh")

    async def revoke(self, token: str) -> None:
        """Ask the server to end the session. Its 200 proves nothing (RFC 7009 answers 200
        even to a refused request): a caller that must know checks afterwards."""
        if self.server.revocation_endpoint is None:
            raise OAuthError("the authorization server has no revocation endpoint")
        resp = await self._send(self.server.revocation_endpoint, {"token": token}, "the revocation")
        if resp.status_code != 200:
            raise _refusal(resp, _json_object(resp), "the revocation")

    async def _send(self, url: str, form: Mapping[str, str], what: str) -> httpx.Response:
        try:
            return await self._post(url, form)
        except httpx.TransportError as e:
            raise OAuthError(f"cannot reach the authorization server for {what} ({type(e).__name__})") from None

    def _tokens(self, resp: httpx.Response, scope: str, what: str) -> TokenSet:
        body = _json_object(resp)
        if resp.status_code != 200:
            raise _refusal(resp, body, what)
        if str(body.get("token_type", "")).lower() != "dpop":
            raise OAuthError(f"{what} gave a {body.get('token_type')!r} token, not a DPoP-bound one")
        check_granted(scope, body.get("scope"))
        access, refresh, sub, expires_in = (body.get("access_token"), body.get("refresh_token"), body.get("sub"),
                                            body.get("expires_in"))
        if not (isinstance(access, str) and isinstance(refresh, str) and isinstance(sub, str)
                and sub.startswith("did:")):
            raise OAuthError(f"{what} answered without an access token, a refresh token or a DID (sub)")
        if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or expires_in <= 0:
            raise OAuthError(f"{what} answered without a valid expires_in")
        return TokenSet(access, refresh, sub, str(body["scope"]), time.time() + float(expires_in))


def _json_object(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _refusal(resp: httpx.Response, body: Mapping[str, Any], what: str) -> OAuthError:
    code = body.get("error") if isinstance(body.get("error"), str) and str(body["error"]).isidentifier() else None
    desc = body.get("error_description")
    desc = "".join(c for c in desc[:200] if c.isprintable()) if isinstance(desc, str) else ""
    text = f"{what} was refused (HTTP {resp.status_code}{', ' + code if code else ''}{': ' + desc if desc else ''})"
    if code == "invalid_grant" and any(s in desc.lower() for s in _SESSION_GONE):
        return SessionGone(text + "; run 'gelbridge login' again", error=code)
    return OAuthError(text, error=code)
