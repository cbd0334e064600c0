"""The one process runtime: which accounts are served (a fixed set, or a fleet member's
leases), one router (DID → the account's worker), one intake (the event sources and
their gap/reconnect hooks), one run loop. ``gelbridge run``, ``[[accounts]]``, the fleet
and the library :class:`~gelbridge._bridge.Bridge` all go through it (docs/architecture.md).

- ``router``: :class:`Account`, :class:`Router` (and :class:`AccountMixup`);
- ``intake``: :class:`Intake`, the sources for the served accounts;
- ``runtime``: :class:`Runtime` (open, attach, upkeep, detach, close, run) and
  :class:`StaticAccounts`, the config's accounts;
- ``shared``: :class:`~gelbridge._runtime.shared.SharedClients`, the model clients and MCP
  servers of the process, shared by the accounts whose configuration they read;
- ``status``: what ``gelbridge status`` shows, read from the state stores.
"""

from gelbridge._runtime.intake import Intake
from gelbridge._runtime.router import Account, AccountMixup, Router
from gelbridge._runtime.runtime import AccountSet, Runtime, StaticAccounts, WorkerFactory

__all__ = ["Account", "AccountMixup", "AccountSet", "Intake", "Router", "Runtime", "StaticAccounts", "WorkerFactory"]
