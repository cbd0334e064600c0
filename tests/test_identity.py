"""Identity resolution rules that need no PDS: the PDS a DID document names must be https
(http only on loopback), and a session must be the account the DID document is about."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gelbridge._config import IdentityConfig
from gelbridge._identity import IdentityError, check_session_did, resolve_account

DID = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"


def doc(endpoint: str) -> Any:
    from atproto_core.did_doc import DidDocument

    return DidDocument.from_dict({
        "id": DID, "alsoKnownAs": ["at://alice.example.com"],
        "service": [{"id": "#atproto_pds", "type": "AtprotoPersonalDataServer", "serviceEndpoint": endpoint}],
    })


@pytest.mark.parametrize(("endpoint", "ok"), [
    ("https://pds.example.com", True), ("http://localhost:2583", True), ("http://127.0.0.1:2583", True),
    ("http://pds.example.com", False), ("ftp://pds.example.com", False),
])
def test_the_app_password_only_goes_to_an_https_pds(monkeypatch: pytest.MonkeyPatch, endpoint: str, ok: bool) -> None:
    from atproto_identity.did.resolver import AsyncDidResolver

    async def resolve(self: Any, did: str) -> Any:
        return doc(endpoint)

    monkeypatch.setattr(AsyncDidResolver, "resolve", resolve)
    run = resolve_account(DID, IdentityConfig())
    if ok:
        assert asyncio.run(run).pds == endpoint
    else:
        with pytest.raises(IdentityError, match="not https|names no PDS"):
            asyncio.run(run)


def test_a_session_of_another_account_is_refused() -> None:
    check_session_did(DID, DID, "alice.example.com", "https://pds.example.com")
    check_session_did("did:plc:other", None, "alice.example.com", "https://pds.example.com")  # pds set: no DID
    with pytest.raises(IdentityError, match="not using it"):
        check_session_did("did:plc:other", DID, "alice.example.com", "https://pds.example.com")
