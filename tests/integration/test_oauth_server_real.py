"""gelbridge's authorization-server client against the reference PDS (no browser needed
here): discovery, PAR through :class:`OAuthClient` (the nonce retry is inside), the
refusals of a made-up code and refresh token classified, revocation, and a refresh whose
answer is lost: sent once, never again, reported as an unknown outcome."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._errors import OAuthError
from gelbridge._oauth.jose import EcKey, pkce_pair
from gelbridge._oauth.scopes import BRIDGE_SCOPE
from gelbridge._oauth.server import AuthServer, OAuthClient, RefreshOutcomeUnknown, SessionGone, discover

from .test_oauth_dpop_real import loopback_client_id

pytestmark = pytest.mark.pds


async def client_for(http: httpx.AsyncClient, dev_pds: DevPds) -> OAuthClient:
    server = await discover(http, dev_pds.pds_url, allow_loopback_http=True)
    return OAuthClient(http, server, loopback_client_id(BRIDGE_SCOPE), EcKey.generate())


async def test_discovery_and_par(dev_pds: DevPds, pds_account: AccountInfo) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        with pytest.raises(OAuthError, match="not an https URL"):
            await discover(http, dev_pds.pds_url)  # http: only in dev mode
        client = await client_for(http, dev_pds)
        assert client.server.issuer.startswith("http://localhost:")
        assert client.server.token_endpoint == f"{client.server.issuer}/oauth/token"
        _, challenge = pkce_pair()
        request_uri = await client.push_authorization(
            redirect_uri="http://127.0.0.1:45679/callback", scope=BRIDGE_SCOPE, state="st",
            code_challenge=challenge, login_hint=pds_account.handle)
        assert request_uri.startswith("urn:ietf:params:oauth:request_uri:")
        url = client.authorization_url(request_uri)
        q = parse_qs(urlsplit(url).query)
        assert q == {"client_id": [client.client_id], "request_uri": [request_uri]}
        assert url.startswith(client.server.authorization_endpoint + "?")  # opened in the user's browser

        with pytest.raises(OAuthError, match="not declared|scope") as refused:  # a scope the client lacks
            await client.push_authorization(redirect_uri="http://127.0.0.1:1/callback",
                                            scope=BRIDGE_SCOPE + " repo:app.bsky.feed.post", state="s",
                                            code_challenge=challenge)
        assert refused.value.error is not None


async def test_refusals_are_classified(dev_pds: DevPds) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        client = await client_for(http, dev_pds)
        verifier, _ = pkce_pair()
        with pytest.raises(OAuthError) as bad_code:
            await client.exchange_code(code="cod-made-up", redirect_uri="http://127.0.0.1/callback",
                                       code_verifier=verifier, scope=BRIDGE_SCOPE)
        assert bad_code.value.error == "invalid_grant" and not isinstance(bad_code.value, SessionGone)
        with pytest.raises(SessionGone, match="gelbridge login") as gone:
            await client.refresh("ref-made-up", scope=BRIDGE_SCOPE)
        assert gone.value.error == "invalid_grant"
        await client.revoke("ref-made-up")  # 200 whatever the token: it proves nothing


async def test_a_lost_refresh_answer_is_never_resent() -> None:
    """A token endpoint that reads the request and hangs up: one request, then the caller
    is told the outcome is unknown (the token may be spent), not retried."""
    requests: list[bytes] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.read(65536))
        writer.close()

    srv = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    server = AuthServer(base, f"{base}/oauth/par", f"{base}/oauth/authorize", f"{base}/oauth/token", None)
    async with srv, httpx.AsyncClient(timeout=5) as http:
        client = OAuthClient(http, server, "http://localhost", EcKey.generate())
        with pytest.raises(RefreshOutcomeUnknown, match="may be spent"):
            await client.refresh("ref-1", scope=BRIDGE_SCOPE)
        await asyncio.sleep(0.2)
    assert len(requests) == 1 and b"refresh_token=ref-1" in requests[0]
