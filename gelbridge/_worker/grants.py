"""One account's key grants in its worker (PROTOCOL.md §6): the bridge record published,
the grants listed before any message is answered, then followed on the event source.

The rules are :class:`gelbridge._grants.GrantBook`'s; this is the shell around it: the
PDS reads and the one write (the bridge record), one log line per grant whose verdict
changes (its record key and the reason, never key material), the ignored counter, and
the counts ``gelbridge status`` shows (a state row of two numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gelbridge._errors import PdsError
from gelbridge._grants import AccountKeys, BridgeKey, BridgeKeys, GrantBook
from gelbridge._records import BRIDGE_COLLECTION, KEY_GRANT_COLLECTION, now_datetime
from gelbridge._seams import Repo

if TYPE_CHECKING:
    from gelbridge._observability import Metrics
    from gelbridge._state import StateStore

log = logging.getLogger("gelbridge.worker")

#: the most grants read for one account (the listing stops there, loudly)
MAX_GRANTS = 100_000


class AccountGrants:
    """The key grants of one account, and the keys its worker opens and seals with."""

    def __init__(self, pds: Repo, did: str, bridge: BridgeKeys, keyring: Mapping[str, bytes], *,
                 store: StateStore, label: str, metrics: Metrics | None = None) -> None:
        self.pds, self.did, self.bridge, self.store = pds, did, bridge, store
        self.label, self.metrics = label, metrics
        self.book = GrantBook(did, bridge, keyring)
        #: keyring first, then the honoured grants; read live by every turn
        self.keys = AccountKeys(keyring, self.book if bridge else None)
        self.published: str | None = None  # what start-up did with the bridge record

    @property
    def enabled(self) -> bool:
        """A bridge without a bridge key honours no grant (and reads none)."""
        return len(self.bridge) > 0

    async def publish(self, *, write: bool = True) -> str:
        """Make the account's ``chat.gel.assistant.bridge`` record for the current bridge key
        what it should be: ``"published"`` (written), ``"kept"`` (already right)."""
        current = self.bridge.current
        assert current is not None
        got = await self.pds.get_record(BRIDGE_COLLECTION, current.kid)
        if got is not None and current.is_published_by(got[1]):
            self.published = "kept"
        else:
            if write:
                await self.pds.put_record(BRIDGE_COLLECTION, current.kid, current.record_value(now_datetime()))
            self.published = "published"
        for older in list(self.bridge)[1:]:
            await self._put_right(older, write=write)
        return self.published

    async def _put_right(self, key: BridgeKey, *, write: bool) -> None:
        """An older key's record that holds another key is rewritten (apps pinned to it
        refuse the impostor); a missing one stays missing: retiring it is the operator's."""
        got = await self.pds.get_record(BRIDGE_COLLECTION, key.kid)
        if got is None or key.is_published_by(got[1]):
            return
        log.warning("%s: the bridge record %s does not hold this bridge's key %s%s", self.label, key.kid, key.kid,
                    ": put right" if write else "")
        if write:
            await self.pds.put_record(BRIDGE_COLLECTION, key.kid, key.record_value(now_datetime()))

    async def load(self) -> None:
        """List every grant of the account and take that as the whole truth (at start, and
        after a gap in the event source, when deletes may have been missed)."""
        if not self.enabled:
            return
        values: dict[str, Any] = {}
        async for r in self.pds.iter_records(KEY_GRANT_COLLECTION, page_size=100):
            values[r.rkey] = r.value
            if len(values) >= MAX_GRANTS:
                log.error("%s: over %d key grants; the rest are not read", self.label, len(values))
                break
        self.book.replace(values)
        await self._changed()

    async def event(self, rkey: str, record: Mapping[str, Any] | None, *, deleted: bool) -> None:
        """A grant record was created, updated or deleted (``record`` None for a ``tooBig``
        commit: read from the PDS)."""
        if not self.enabled:
            return
        if deleted:
            if not self.book.delete(rkey):
                return
        else:
            if record is None:
                try:
                    got = await self.pds.get_record(KEY_GRANT_COLLECTION, rkey)
                except PdsError as e:
                    log.error("%s: key grant %s could not be read (%s); it is read again after the next gap",
                              self.label, rkey, type(e).__name__)
                    return
                if got is None:
                    self.book.delete(rkey)
                    await self._changed()
                    return
                record = got[1]
            self.book.put(rkey, record)
        await self._changed()

    async def _changed(self) -> None:
        """One log line per grant whose verdict the last change changed; the counts saved."""
        changes = self.book.last_changes
        for rkey, _, new in sorted(changes, key=lambda c: c[0]):
            if new is None:
                log.info("%s: key grant %s deleted: its key is forgotten", self.label, rkey)
            elif new.honoured:
                log.info("%s: key grant %s honoured", self.label, rkey)
            else:
                log.warning("%s: key grant %s ignored: %s", self.label, rkey, new.reason)
                if self.metrics is not None:
                    self.metrics.grant_ignored(self.label, str(new.code))
        if changes:
            await self.store.save_grant_counts(self.did, self.book.honoured, self.book.ignored)
