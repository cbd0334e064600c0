"""The OAuth core against the reference PDS's own authorization server: a pushed
authorization request for the loopback client with the bridge's least scope, DPoP-signed
by gelbridge's proofs. The first PAR is refused for its missing nonce (400
``use_dpop_nonce`` with a ``DPoP-Nonce``), the retry with it is accepted (201); a proof
for another URL, a replayed proof and a stale nonce are refused by the real server."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import httpx
import pytest

from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._oauth.dpop import NonceBook, dpop_proof, is_nonce_error
from gelbridge._oauth.jose import EcKey, pkce_pair
from gelbridge._oauth.scopes import BRIDGE_SCOPE

pytestmark = pytest.mark.pds


def loopback_client_id(scope: str) -> str:
    """The loopback client (docs/research/oauth.md §3): no port, so any port at request time."""
    return "http://localhost?" + urlencode(
        {"redirect_uri": "http://127.0.0.1/callback", "scope": scope}, quote_via=quote)


def par_form(client_id: str, login_hint: str) -> dict[str, str]:
    _, challenge = pkce_pair()
    return {"client_id": client_id, "response_type": "code", "redirect_uri": "http://127.0.0.1:45678/callback",
            "scope": BRIDGE_SCOPE, "state": "s-1", "code_challenge": challenge,
            "code_challenge_method": "S256", "login_hint": login_hint}


async def test_par_with_dpop_nonce_dance_on_the_real_authorization_server(
    dev_pds: DevPds, pds_account: AccountInfo,
) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        pr = (await http.get(f"{dev_pds.pds_url}/.well-known/oauth-protected-resource")).json()
        issuer = pr["authorization_servers"][0]
        meta = (await http.get(f"{dev_pds.pds_url}/.well-known/oauth-authorization-server")).json()
        assert meta["issuer"] == issuer and meta["require_pushed_authorization_requests"] is True
        assert "ES256" in meta["dpop_signing_alg_values_supported"]
        par = meta["pushed_authorization_request_endpoint"]
        key, book = EcKey.generate(), NonceBook()
        client_id = loopback_client_id(BRIDGE_SCOPE)

        async def push(proof: str) -> httpx.Response:
            resp = await http.post(par, data=par_form(client_id, pds_account.handle), headers={"DPoP": proof})
            book.seen(par, resp.headers)
            return resp

        first = await push(dpop_proof(key, "POST", par, nonce=book.get(par)))
        assert first.status_code == 400 and is_nonce_error(400, first.headers, first.content)
        assert book.get(par)  # the refusal carried the nonce

        # a proof bound to another URL is refused even with the right nonce
        wrong = await push(dpop_proof(key, "POST", meta["token_endpoint"], nonce=book.get(par)))
        assert wrong.status_code in (400, 401) and wrong.json()["error"] == "invalid_dpop_proof", wrong.text
        assert "htu" in wrong.text

        proof = dpop_proof(key, "POST", par, nonce=book.get(par))
        ok = await push(proof)
        assert ok.status_code == 201, ok.text
        body = ok.json()
        assert body["request_uri"].startswith("urn:ietf:params:oauth:request_uri:") and body["expires_in"] > 0

        replayed = await push(proof)  # the same proof again: jti is single use
        assert replayed.status_code in (400, 401) and "replayed" in replayed.text, replayed.text

        stale = await push(dpop_proof(key, "POST", par, nonce="not-a-nonce-the-server-gave"))
        assert stale.status_code in (400, 401) and "nonce" in stale.text.lower(), stale.text
        assert is_nonce_error(stale.status_code, stale.headers, stale.content) or "mismatch" in stale.text

