"""What ``gelbridge status`` shows: read from the state stores only (the process need not
run), for the one ``[account]`` or every ``[[accounts]]`` entry.

Per account: who it is, its source cursor, the replies in flight, the PDS write points
its turns spent in the last hour and day (claim, progress updates and final write of each
reply; the user's own app spends from the same budget) and the budget the PDS last
stated, then its recent turns. Errors are listed per state store.
"""

from __future__ import annotations

import time
from typing import Any

from gelbridge._config import AccountEntry, Settings
from gelbridge._errors import ConfigError
from gelbridge._state import DB_FILENAME, SqliteStore, StateStore, TurnTiming, state_location
from gelbridge._worker.service import session_key
from gelbridge._worker.sources import firehose_cursor_key

HOUR, DAY = 3600.0, 86400.0


async def status_report(settings: Settings, store: StateStore, *, now: float | None = None) -> dict[str, Any]:
    """The status of every account of ``settings``; ``store`` is the process's own store
    (``[state] dir``: shared cursors, and the state of accounts that keep theirs there)."""
    now = time.time() if now is None else now
    try:
        entries = settings.accounts_list()
    except ConfigError:  # no account configured: show what the store holds
        entries = [AccountEntry(pds="", identifier="")]
    stores: dict[str, StateStore] = {state_location(settings): store}
    accounts: list[dict[str, Any]] = []
    try:
        per: list[tuple[AccountEntry, Settings, StateStore | None, dict[str, Any]]] = []
        for entry in entries:
            acct = settings.for_account(entry) if entry.identifier else settings
            own = _store_at(acct, stores)
            saved = (await own.load_session(session_key(acct)) or {}) if own is not None else {}
            per.append((entry, acct, own, saved))
        hosts: dict[str, list[str]] = {}  # firehose: one subscription per host carries its accounts
        for _, acct, _, saved in per:
            if saved.get("did"):
                hosts.setdefault(_pds_of(acct, saved), []).append(saved["did"])
        for entry, acct, own, saved in per:
            accounts.append(await _account(settings, entry, acct, own, saved, store, hosts, now))
        errors = [
            {"at": e.at, "kind": e.kind, "record": e.record_key, "where": e.where}
            for s in stores.values() for e in await s.recent_errors(10)
        ]
        errors.sort(key=lambda e: float(e["at"] or 0), reverse=True)
    finally:
        for s in stores.values():
            if s is not store:
                await s.aclose()
    fleet = None
    if store.backend == "postgres":
        from gelbridge._fleet import fleet_view, lease_key

        keys = {lease_key(settings.for_account(e) if e.identifier and settings.accounts else settings): i
                for i, e in enumerate(entries)}
        fleet = await fleet_view(store, list(keys))
        if fleet is not None:
            for key, i in keys.items():
                accounts[i]["lease"] = fleet["leases"].get(key)
    return {"state": store.location, "backend": store.backend, "source": settings.watch.source, "accounts": accounts,
            "errors": errors[:10], "fleet": fleet}


def _store_at(acct: Settings, stores: dict[str, StateStore]) -> StateStore | None:
    """The store of an account: the process's (same [state] url or dir), or its own
    SQLite file (None when that does not exist yet)."""
    where = state_location(acct)
    if where not in stores:
        if not (acct.state_dir / DB_FILENAME).exists():
            return None
        stores[where] = SqliteStore.open_dir(acct.state_dir)
    return stores[where]


def _pds_of(acct: Settings, saved: dict[str, Any]) -> str:
    return str(saved.get("pds") or acct.account.pds or "").rstrip("/")


async def _account(settings: Settings, entry: AccountEntry, acct: Settings, own: StateStore | None,
             saved: dict[str, Any], process_store: StateStore, hosts: dict[str, list[str]],
             now: float) -> dict[str, Any]:
    did = saved.get("did")
    configured = bool(entry.identifier)
    out: dict[str, Any] = {
        "name": entry.label if entry.identifier else None,
        "did": did, "handle": saved.get("handle"), "pds": _pds_of(acct, saved) or None,
        "cursor": None, "in_flight": [], "points": {"last_hour": 0, "last_day": 0}, "budget": None,
        "grants": None, "turns": [],
    }
    if own is not None and not configured:  # no account in the config: every turn the store has
        out["turns"] = [_turn(t) for t in await own.recent_turns(10)]
    if not did or own is None:
        return out
    w = settings.watch
    if w.source == "firehose":
        out["cursor"] = await process_store.get_cursor(firehose_cursor_key(out["pds"] or "", hosts.get(out["pds"], did)))
    elif w.source == "jetstream" and w.url:
        from gelbridge._jetstream import jetstream_cursor_key  # it imports the worker package

        out["cursor"] = await process_store.get_cursor(jetstream_cursor_key(w.url))
    out["in_flight"] = [
        {"reply": c.reply_rkey, "status": c.status, "since": c.created_at, "updated": c.updated_at}
        for c in await own.unfinished_claims(did)
    ]
    out["points"] = {"last_hour": await own.points_since(did, now - HOUR), "last_day": await own.points_since(did, now - DAY)}
    out["budget"] = await own.load_write_budget(did)
    out["grants"] = await own.load_grant_counts(did)
    out["turns"] = [_turn(t) for t in await own.recent_turns(10, account=did)]
    return out


def _turn(t: TurnTiming) -> dict[str, Any]:
    return {"at": t.at, "reply": t.reply_rkey, "status": t.status, "queue_ms": round(t.queue_ms, 1),
            "read_ms": round(t.read_ms, 1) if t.read_ms is not None else None,
            "bridge_ms": round(t.bridge_ms, 1), "model_ms": round(t.model_ms, 1), "write_ms": round(t.write_ms, 1),
            "total_ms": round(t.total_ms, 1), "points": t.points, "input_tokens": t.input_tokens,
            "cached_tokens": t.cached_tokens, "cache_write_tokens": t.cache_write_tokens}
