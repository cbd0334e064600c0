"""The session keeper: many workers (separate stores on one SQLite file, as separate
processes would be) refreshing one session at once send exactly one token request; a lost
answer, a dead refresher's mark and an ended session end in ``reauth_needed`` with no
request resent; a server that was never reached leaves the session usable.

The token endpoint is a loopback HTTP server with the reference PDS's refresh rules
(docs/research/oauth.md §6): single use with rotation, a replay ends the whole session.
The same flows against the real PDS need a browser-approved session (issue 26, next)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest

from gelbridge._oauth.jose import EcKey
from gelbridge._oauth.keeper import ReauthNeeded, SessionKeeper
from gelbridge._oauth.scopes import BRIDGE_SCOPE
from gelbridge._oauth.server import AuthServer, OAuthClient, ServerUnreachable
from gelbridge._oauth.session import OAuthSession, new_secret, open_session, seal_session
from gelbridge._state._sqlite import SqliteStore

SECRET = base64.b64decode(new_secret())
ACCOUNT = "alice.test"


class TokenServer:
    """Refresh tokens rotate; a replay deletes the session; ``mode`` ``hangup`` reads and closes."""

    def __init__(self) -> None:
        self.requests: list[dict[str, list[str]]] = []
        self.current: str | None = "rt-0"
        self.n = 0
        self.delay = 0.0
        self.mode = "normal"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                outer.requests.append(form)
                if outer.mode == "hangup":
                    self.close_connection = True
                    self.connection.close()
                    return
                time.sleep(outer.delay)
                token = form["refresh_token"][0]
                if token != outer.current:
                    outer.current = None  # the whole session is gone
                    self._answer(400, {"error": "invalid_grant", "error_description": "Refresh token replayed"})
                    return
                outer.n += 1
                outer.current = f"rt-{outer.n}"
                self._answer(200, {"access_token": f"at-{outer.n}", "refresh_token": outer.current,
                                   "token_type": "DPoP", "scope": BRIDGE_SCOPE, "expires_in": 3600,
                                   "sub": "did:plc:alice"})

            def _answer(self, status: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("DPoP-Nonce", "n-1")
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.server = AuthServer(base, f"{base}/par", f"{base}/authorize", f"{base}/token", None)


@pytest.fixture
def token_server() -> Iterator[TokenServer]:
    ts = TokenServer()
    t = threading.Thread(target=ts.httpd.serve_forever, daemon=True)
    t.start()
    yield ts
    ts.httpd.shutdown()
    ts.httpd.server_close()


def first_session(issuer: str) -> OAuthSession:
    return OAuthSession(did="did:plc:alice", pds_url="http://localhost:1", issuer=issuer, client_id="http://localhost",
                        scope=BRIDGE_SCOPE, access_token="at-0", refresh_token="rt-0", expires_at=time.time() + 30,
                        dpop_key=EcKey.generate(), created_at=time.time(), refreshed_at=time.time())


def keeper_on(store: SqliteStore, http: httpx.AsyncClient, server: AuthServer, **kw: float) -> SessionKeeper:
    return SessionKeeper(store, ACCOUNT, SECRET, lambda s: OAuthClient(http, server, s.client_id, s.dpop_key), **kw)


async def stored(path: Path) -> OAuthSession:
    store = SqliteStore(path)
    try:
        row = await store.load_session(ACCOUNT)
        assert row is not None
        return open_session(row, account=ACCOUNT, secret=SECRET)
    finally:
        await store.aclose()


async def seeded(path: Path, session: OAuthSession) -> None:
    store = SqliteStore(path)
    await store.save_session(ACCOUNT, seal_session(session, account=ACCOUNT, secret=SECRET))
    await store.aclose()


async def test_five_workers_refreshing_at_once_send_one_token_request(tmp_path: Path, token_server: TokenServer) -> None:
    db = tmp_path / "state.db"
    await seeded(db, first_session(token_server.server.issuer))
    token_server.delay = 0.3  # a slow answer: the others arrive while it is in flight
    stores = [SqliteStore(db) for _ in range(5)]
    async with httpx.AsyncClient(timeout=5) as http:
        keepers = [keeper_on(s, http, token_server.server) for s in stores]
        got = await asyncio.gather(*(k.refreshed("at-0") for k in keepers))
        assert len(token_server.requests) == 1 and sum(k.token_requests for k in keepers) == 1
        assert {s.access_token for s in got} == {"at-1"} and {s.refresh_token for s in got} == {"rt-1"}
        assert all(k.due(s) is False for k, s in zip(keepers, got, strict=True))
        # due again later: one more request, with the new token (never the spent one)
        again = await keepers[3].refreshed("at-1")
        assert again.access_token == "at-2" and token_server.requests[-1]["refresh_token"] == ["rt-1"]
    for s in stores:
        await s.aclose()
    final = await stored(db)
    assert (final.state, final.refresh_token) == ("ok", "rt-2") and token_server.current == "rt-2"


async def test_a_lost_answer_is_never_resent(tmp_path: Path, token_server: TokenServer) -> None:
    db = tmp_path / "state.db"
    await seeded(db, first_session(token_server.server.issuer))
    token_server.mode = "hangup"
    store = SqliteStore(db)
    async with httpx.AsyncClient(timeout=5) as http:
        k = keeper_on(store, http, token_server.server)
        with pytest.raises(ReauthNeeded, match="gelbridge login"):
            await k.refreshed("at-0")
        with pytest.raises(ReauthNeeded):  # the next worker, the next call: nothing sent
            await keeper_on(store, http, token_server.server).refreshed("at-0")
        with pytest.raises(ReauthNeeded):
            await k.current()
    await store.aclose()
    assert len(token_server.requests) == 1
    dead = await stored(db)
    assert (dead.state, dead.reason) == ("reauth_needed", "refresh_outcome_unknown")


async def test_a_dead_refreshers_mark_ages_into_reauth_needed(tmp_path: Path, token_server: TokenServer) -> None:
    db = tmp_path / "state.db"
    await seeded(db, first_session(token_server.server.issuer).with_state("refreshing", time.time() - 120))
    store = SqliteStore(db)
    async with httpx.AsyncClient(timeout=5) as http:
        with pytest.raises(ReauthNeeded, match="refresh_unfinished"):
            await keeper_on(store, http, token_server.server, in_flight_limit=60).refreshed("at-0")
        # a fresh mark is waited for, never taken over: when it is still there past the
        # limit, its refresher is presumed dead (the token may be spent)
        await store.save_session(ACCOUNT, seal_session(first_session(token_server.server.issuer).with_state(
            "refreshing", time.time()), account=ACCOUNT, secret=SECRET))
        t0 = time.monotonic()
        with pytest.raises(ReauthNeeded, match="refresh_unfinished"):
            await keeper_on(store, http, token_server.server, in_flight_limit=0.5).refreshed("at-0")
        assert 0.4 < time.monotonic() - t0 < 10
    await store.aclose()
    assert token_server.requests == []


async def test_an_ended_session_and_an_unreachable_server(tmp_path: Path, token_server: TokenServer) -> None:
    db = tmp_path / "state.db"
    await seeded(db, first_session(token_server.server.issuer))
    store = SqliteStore(db)
    async with httpx.AsyncClient(timeout=2) as http:
        gone = AuthServer("http://127.0.0.1:1", "", "", "http://127.0.0.1:1/token", None)  # nothing listens
        with pytest.raises(ServerUnreachable):
            await keeper_on(store, http, gone).refreshed("at-0")
        assert (await stored(db)).state == "ok"  # nothing was spent: usable, retried later
        token_server.current = "rt-other"  # the server no longer knows rt-0 (revoked or replayed elsewhere)
        with pytest.raises(ReauthNeeded, match="invalid_grant"):
            await keeper_on(store, http, token_server.server).refreshed("at-0")
    await store.aclose()
    dead = await stored(db)
    assert (dead.state, dead.reason) == ("reauth_needed", "session_ended") and len(token_server.requests) == 1
