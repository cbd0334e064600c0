"""One account's OAuth session kept fresh in the state store, by one refresher at a time
across a fleet, without ever sending a refresh token twice.

A refresh token is single use, and the reference PDS deletes the whole session when one
is replayed (docs/research/oauth.md §6). So a refresh goes:

1. under the session's row lock (``StateStore.update_session``): re-read; if another
   worker already refreshed (the access token is not the one we saw), use theirs; if one
   is refreshing now, wait for it; else mark the row ``refreshing`` and commit;
2. send the one token request, outside any lock;
3. store the new tokens (state ``ok``).

The lock is not held across the request on purpose: a worker killed mid-request would
release it, and the next one would resend the spent token. A ``refreshing`` mark older
than ``in_flight_limit`` (its refresher died, or lost the answer), a lost answer and a
server that ended the session all leave the row ``reauth_needed``: loud, and nothing is
resent until an operator runs ``gelbridge login``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gelbridge._errors import OAuthError
from gelbridge._oauth.server import OAuthClient, RefreshOutcomeUnknown, ServerUnreachable, SessionGone
from gelbridge._oauth.session import OAuthSession, is_oauth_row, open_session, seal_session
from gelbridge._state import StateStore

log = logging.getLogger("gelbridge.oauth")

#: server refusals that are known to leave the refresh token unspent (checked before it
#: is consumed: client authentication and the DPoP proof)
_UNSPENT = frozenset({"invalid_client", "use_dpop_nonce", "invalid_dpop_proof"})


class ReauthNeeded(OAuthError):
    """The account's OAuth session cannot be used any more: run ``gelbridge login``."""

    def __init__(self, account: str, reason: str) -> None:
        super().__init__(f"the OAuth session of {account} needs a new login ({reason}): run "
                         f"'gelbridge login' for it; nothing is retried until then", error=reason)
        self.reason = reason


class SessionKeeper:
    """``client``: the :class:`OAuthClient` for a session (its server, client_id and DPoP key)."""

    def __init__(self, store: StateStore, account: str, secret: bytes,
                 client: Callable[[OAuthSession], OAuthClient], *, clock: Callable[[], float] = time.time,
                 refresh_margin: float = 300.0, in_flight_limit: float = 60.0, poll: float = 0.1) -> None:
        self.store, self.account, self._secret, self._client = store, account, secret, client
        self._clock, self.refresh_margin = clock, refresh_margin
        self.in_flight_limit, self._poll = in_flight_limit, poll
        self._lock = asyncio.Lock()  # one refresh at a time in this process
        self.token_requests = 0

    def _open(self, row: dict[str, Any] | None) -> OAuthSession:
        if not is_oauth_row(row):
            raise OAuthError(f"no OAuth session is stored for {self.account}: run 'gelbridge login'")
        assert row is not None
        return open_session(row, account=self.account, secret=self._secret)

    def _seal(self, session: OAuthSession) -> dict[str, Any]:
        return seal_session(session, account=self.account, secret=self._secret)

    async def current(self) -> OAuthSession:
        """The stored session, as it is now (raises :class:`ReauthNeeded` when it is dead)."""
        s = self._open(await self.store.load_session(self.account))
        if s.state == "reauth_needed":
            raise ReauthNeeded(self.account, s.reason or "reauth_needed")
        return s

    def due(self, session: OAuthSession) -> bool:
        return session.expires_at - self._clock() < self.refresh_margin

    async def fresh(self) -> OAuthSession:
        """The session, refreshed first when its access token is near its expiry."""
        s = await self.current()
        return await self.refreshed(s.access_token) if self.due(s) else s

    async def refreshed(self, stale_access_token: str) -> OAuthSession:
        """A session whose access token is not ``stale_access_token`` (refused or due):
        another worker's refresh, or this one's."""
        async with self._lock:
            deadline = self._clock() + self.in_flight_limit + 5.0
            while True:
                verdict, session = await self._claim(stale_access_token)
                if verdict == "use":
                    return session
                if verdict == "mine":
                    return await self._refresh(session)
                if self._clock() > deadline:  # bounded: the mark ages into reauth_needed anyway
                    raise ReauthNeeded(self.account, "refresh_stuck")
                await asyncio.sleep(self._poll)

    async def _claim(self, stale: str) -> tuple[str, OAuthSession]:
        """Under the row lock: ``use`` (someone refreshed), ``wait`` (someone is), or
        ``mine`` (marked refreshing by us)."""
        out: dict[str, OAuthSession] = {}
        verdict = ["wait"]

        def change(row: dict[str, Any] | None) -> dict[str, Any] | None:
            s = self._open(row)
            now = self._clock()
            out["s"] = s
            if s.state == "reauth_needed":
                verdict[0] = "dead"
                return None
            if s.state == "ok" and s.access_token != stale:
                verdict[0] = "use"
                return None
            if s.state == "refreshing":
                if s.state_since is not None and now - s.state_since < self.in_flight_limit:
                    return None  # wait
                verdict[0] = "dead"  # its refresher died or lost the answer: the token may be spent
                out["s"] = s.with_state("reauth_needed", now, "refresh_unfinished")
                return self._seal(out["s"])
            verdict[0] = "mine"
            return self._seal(s.with_state("refreshing", now))

        await self.store.update_session(self.account, change)
        s = out["s"]
        if verdict[0] == "dead":
            reason = s.reason or "reauth_needed"
            log.error("the OAuth session of %s needs a new login (%s): run 'gelbridge login'", self.account, reason)
            raise ReauthNeeded(self.account, reason)
        return verdict[0], s

    async def _refresh(self, s: OAuthSession) -> OAuthSession:
        self.token_requests += 1
        try:
            tokens = await self._client(s).refresh(s.refresh_token, scope=s.scope)
        except (RefreshOutcomeUnknown, SessionGone) as e:
            await self._mark_dead(s, "refresh_outcome_unknown" if isinstance(e, RefreshOutcomeUnknown)
                                  else "session_ended")
            raise ReauthNeeded(self.account, e.error or type(e).__name__) from None
        except OAuthError as e:
            if isinstance(e, ServerUnreachable) or e.error in _UNSPENT:
                await self.store.update_session(self.account, lambda _row: self._seal(s.with_state("ok", None)))
                raise
            await self._mark_dead(s, "refresh_refused")  # e.g. a 5xx: whether the token was spent is unknown
            raise ReauthNeeded(self.account, e.error or "refresh_refused") from None
        new = replace(s, access_token=tokens.access_token, refresh_token=tokens.refresh_token,
                      expires_at=tokens.expires_at, scope=tokens.scope, refreshed_at=self._clock(),
                      state="ok", state_since=None, reason=None)
        await self.store.update_session(self.account, lambda _row: self._seal(new))
        log.info("refreshed the OAuth session of %s (access token valid %.0f s)", self.account,
                 tokens.expires_at - self._clock())
        return new

    async def _mark_dead(self, s: OAuthSession, reason: str) -> None:
        log.error("the OAuth session of %s needs a new login (%s): run 'gelbridge login'", self.account, reason)
        await self.store.update_session(
            self.account, lambda _row: self._seal(s.with_state("reauth_needed", self._clock(), reason)))
