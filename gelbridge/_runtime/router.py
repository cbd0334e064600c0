"""DID → the account served here: the one place a record is routed to a worker.

Every record of every source (firehose, Jetstream, poll, a library feed) reaches a turn
through :meth:`Router.route`: looked up by its DID, checked against the account (down to
the DID of the PDS session its worker writes through: :meth:`Account.check`), handed to
that worker's :meth:`~gelbridge._worker.Worker.handle_event`. There is no path from an
event of one DID to another account's keyring or repo.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gelbridge._config import Settings
from gelbridge._errors import ConfigError, GelbridgeError
from gelbridge._ingest import IncomingRecord
from gelbridge._state import Fence
from gelbridge._worker import Worker
from gelbridge._worker.decide import EventOutcome

log = logging.getLogger("gelbridge.runtime")


class AccountMixup(GelbridgeError):
    """A record was about to be handled by a worker of another account (a bug; never happens)."""

    kind = "invalid_request"


@dataclass(frozen=True)
class Account:
    """One served account: its label, DID, narrowed settings and started worker (own
    keyring, PDS session and state); ``fence``: its fleet lease (None outside a fleet)."""

    label: str
    did: str
    settings: Settings
    worker: Worker
    fence: Fence | None = None

    @property
    def pds_host(self) -> str:
        """The PDS it lives on (no trailing slash): one firehose subscription per host."""
        return self.worker.pds.pds_url.rstrip("/")

    def check(self, did: str) -> None:
        """Refuse to handle a record of ``did`` unless this account *is* ``did``, down to the
        DID of the PDS session its worker writes through."""
        session = self.worker.pds.session if self.worker.started else None
        if not (did == self.did == self.worker.did and session is not None and session.did == did):
            raise AccountMixup(f"record of {did} routed to account {self.label} ({self.did}); not handled")


class Router:
    """The accounts served in this process, by DID; :meth:`route` hands a record to its one."""

    def __init__(self, stats: Counter[str] | None = None) -> None:
        self._by_did: dict[str, Account] = {}
        #: ``unrouted`` and ``handled-<outcome>`` counts (the Bridge's ``stats``)
        self.stats: Counter[str] = stats if stats is not None else Counter()

    def add(self, account: Account) -> None:
        """Serve ``account``: :class:`ConfigError` if its DID is served already (the same
        account listed twice), :class:`AccountMixup` if its worker is not logged in as it."""
        other = self._by_did.get(account.did)
        if other is not None:
            raise ConfigError(f"accounts {other.label} and {account.label} are the same account "
                              f"({account.did}); list each account once")
        account.check(account.did)
        self._by_did[account.did] = account

    def remove(self, did: str) -> Account | None:
        return self._by_did.pop(did, None)

    def get(self, did: str) -> Account | None:
        return self._by_did.get(did)

    def view(self) -> Mapping[str, Account]:
        """The served accounts by DID (read-only, live)."""
        return MappingProxyType(self._by_did)

    def __iter__(self) -> Iterator[Account]:
        return iter(list(self._by_did.values()))

    def __len__(self) -> int:
        return len(self._by_did)

    def on_host(self, host: str | None) -> list[Account]:
        """The accounts on the PDS ``host`` (None: all, as a Jetstream connection carries)."""
        return [a for a in self._by_did.values() if host is None or a.pds_host == host]

    async def route(self, rec: IncomingRecord, received_at: float | None = None) -> str:
        """Handle ``rec`` with the worker of its account; the worker's decision, once its
        effects are durable (``ignored`` for a DID not served here)."""
        account = self._by_did.get(rec.did)
        if account is None:
            self.stats["unrouted"] += 1
            return EventOutcome.IGNORED
        account.check(rec.did)
        result = await account.worker.handle_event(rec, received_at=received_at)
        self.stats[f"handled-{result}"] += 1
        return result
