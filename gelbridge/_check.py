"""``gelbridge check``: an operator's mistake is found at start, never in a user's chat.

The file itself is checked when it is read (``config.read_config``: every unknown key
with the closest valid name, every wrong value, all at once). This module checks the
configuration against the world, as far as it parsed (:func:`check_config` reports
both in one run): every ``[adapters] dirs`` entry exists; every ``[providers.*]`` names
a loaded adapter, its ``api_key_env`` is set, and it answers at base_url for that key
and has the default models (``_adapters/probe.py``: one free request each); every
default model names a configured provider and every default tool exists (a
provider-run tool such as ``web_search``: some configured provider's adapter has it); each
account's keyring is readable and holds a key; every MCP server starts and lists its
tools; ``[observability] listen`` can be bound (it is released at once); ``[state]``
can be used; the PDS answers and the credentials log in (a fresh createSession,
whatever session the state holds; the session is deleted again, and a main password
instead of an app password is a warning). ``gelbridge run`` runs the same checks before
it opens its state, and exits non-zero on any problem, before anything is written to a
PDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gelbridge._config import NO_FILE, DefaultsConfig, ReadConfig, Settings
from gelbridge._errors import GelbridgeError, PdsAuthError, PdsError, PdsRateLimited
from gelbridge._tools.config import NATIVE_TOOLS

if TYPE_CHECKING:
    from gelbridge._adapters.registry import AdapterRegistry
    from gelbridge._config import ModelChoice

#: createSession calls at once when many accounts are checked
_LOGINS_AT_ONCE = 8


@dataclass
class CheckReport:
    """What was checked (``lines``, a short summary), what is wrong (``problems``, one
    line each; empty: all is well) and what works but should change (``warnings``)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, other: CheckReport) -> None:
        self.lines += other.lines
        self.problems += other.problems
        self.warnings += other.warnings


async def check_config(read: ReadConfig, *, environ: Mapping[str, str], login: bool = True,
                       probe: bool = True) -> CheckReport:
    """The file's problems (``read.problems``) and the world's (:func:`check_settings` on
    what parsed) in one report. No file at all and no account from the environment: one
    problem that says so (the world checks would only find the defaults wanting)."""
    if read.path is None and not read.settings.account.identifier:
        return CheckReport(problems=[NO_FILE])
    rep = await check_settings(read.settings, environ=environ, login=login, probe=probe)
    rep.problems[:0] = read.problems
    if read.path is None:
        rep.lines.insert(0, "config     no file: embedded defaults and the environment")
    return rep


async def check_settings(settings: Settings, *, environ: Mapping[str, str], login: bool = True,
                         probe: bool = True) -> CheckReport:
    """Check ``settings`` against adapters, environment, keyrings, MCP servers and (with
    ``login``) the PDS. Never raises for a problem it can name."""
    rep = CheckReport()
    try:
        accounts = settings.accounts_list()
    except GelbridgeError as e:
        rep.problems.append(str(e))
        accounts = []
    if settings.watch.source == "jetstream":
        from gelbridge._jetstream import jetstream_url

        try:
            jetstream_url(settings.watch)
        except GelbridgeError as e:
            rep.problems.append(str(e))
    if settings.observability.traces:
        from gelbridge import _tracing as tracing

        if not tracing.available():
            rep.problems.append(tracing.EXTRA_HINT)
        else:
            rep.lines.append(f"traces     OTLP/HTTP to {settings.observability.otlp_endpoint or 'the SDK default'}")
    if settings.observability.listen:
        from gelbridge._observability import probe_listen

        problem = await probe_listen(settings.observability.listen)  # bound and released at once
        if problem:
            rep.problems.append(problem)
        else:
            rep.lines.append(f"health     {settings.observability.listen} is free (/healthz, /readyz, /metrics)")
    _check_state(settings, rep)
    _check_adapter_dirs(settings, rep)
    _check_request_bound(settings, rep)
    adapters = _check_providers(settings, environ, rep)
    if probe:
        await _check_probes(settings, environ, rep)
    per_account = [settings.for_account(a) for a in accounts] if settings.accounts else (
        [settings] if accounts else [])
    bridged = _check_bridge_keys(settings, environ, rep)
    for acct in per_account:
        _check_defaults(acct, rep, label=_label(settings, acct))
        _check_keyring(acct, environ, rep, label=_label(settings, acct), bridged=bridged)
    await _check_tools(settings, environ, rep, adapters)
    if login:
        gate = asyncio.Semaphore(_LOGINS_AT_ONCE)

        async def one(acct: Settings) -> CheckReport:
            part = CheckReport()
            async with gate:
                await _check_login(acct, environ, part, label=_label(settings, acct))
            return part

        for part in await asyncio.gather(*(one(a) for a in per_account)):
            rep.add(part)
    return rep


def _check_state(settings: Settings, rep: CheckReport) -> None:
    """``[state] url``: PostgreSQL answers and holds no newer schema; or ``[state] dir``
    can hold the SQLite file. Nothing is created or changed."""
    url = settings.state.url
    if not url:
        problem = _state_dir_problem(settings.state_dir)
        if problem:
            rep.problems.append(f"[state] dir: {problem}")
        return
    from gelbridge._state._postgres import probe, redacted

    try:
        version = probe(url, settings.state.timeout)
    except GelbridgeError as e:
        rep.problems.append(f"[state] url: {e}")
        return
    schema = f"schema v{version}" if version else "empty: the first worker creates the tables"
    rep.lines.append(f"state      {redacted(url)} ({schema}); a fleet with leases of {settings.fleet.lease_seconds:g} s")


def _state_dir_problem(d: Path) -> str | None:
    """Why the state directory ``d`` cannot be used (None: it can, or can be created)."""
    import os

    if d.exists():
        if not d.is_dir():
            return f"{d} is a file, not a directory; point [state] dir at a directory"
        return None if os.access(d, os.W_OK | os.X_OK) else f"{d} is not writable by this user"
    parent = d.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{d} cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{d} cannot be created: {parent} is not writable by this user"
    return None


def _label(settings: Settings, acct: Settings) -> str:
    return f"[[accounts]] {acct.account.identifier}" if settings.accounts else "[account]"


def _check_adapter_dirs(settings: Settings, rep: CheckReport) -> None:
    """``[adapters] dirs``: each one a directory (a missing one would be skipped unseen)."""
    for d in settings.adapters.dirs:
        path = d.expanduser()
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            rep.problems.append(f"[adapters] dirs: {path} {what}: create it (your .lua adapters go there) "
                                "or take it out of dirs")


#: How many times over an adapter's Lua runtime must hold the largest request: the
#: request's JSON, its decoded tables and the provider body the script builds.
REQUEST_MEMORY_FACTOR = 4


def _check_request_bound(settings: Settings, rep: CheckReport) -> None:
    """``[thread] max_request_bytes`` fits the adapters' memory (else every large thread
    would end in a sandbox memory error instead of its clear "too large" reply)."""
    need = settings.thread.max_request_bytes * REQUEST_MEMORY_FACTOR
    have = settings.adapters.memory_limit_mb * 1024 * 1024
    if need > have:
        rep.problems.append(
            f"[thread] max_request_bytes = {settings.thread.max_request_bytes}: an adapter needs about "
            f"{REQUEST_MEMORY_FACTOR} times that in memory and [adapters] memory_limit_mb is "
            f"{settings.adapters.memory_limit_mb}; raise memory_limit_mb to at least {-(-need // (1024 * 1024))} "
            "or lower max_request_bytes")


def _check_providers(settings: Settings, environ: Mapping[str, str], rep: CheckReport) -> AdapterRegistry | None:
    """Each provider names a loaded adapter and has its key. Returns the adapters (None:
    they could not be loaded at all)."""
    from gelbridge._adapters.registry import registry_from_settings

    try:
        registry = registry_from_settings(settings)
    except GelbridgeError as e:
        rep.problems.append(f"[adapters]: {e}")
        return None
    names = set(registry.names())
    for entry in registry.entries():
        if entry.status == "failed" and not entry.builtin:
            rep.problems.append(f"[adapters] {entry.source}: does not load: {entry.error}")
    for name, p in settings.providers.items():
        if p.adapter not in names:
            rep.problems.append(f"[providers.{name}] adapter = {p.adapter!r}: no such adapter (loaded: "
                                f"{', '.join(sorted(names))}; see 'gelbridge adapters list')")
        if p.api_key_env and not environ.get(p.api_key_env):
            rep.problems.append(f"[providers.{name}] api_key_env: ${p.api_key_env} is not set; export the API key in it")
    rep.lines.append(f"providers  {', '.join(f'{n} ({p.adapter})' for n, p in settings.providers.items()) or 'none'}")
    return registry


async def _check_probes(settings: Settings, environ: Mapping[str, str], rep: CheckReport) -> None:
    """Each provider answers at base_url, takes the key and has the default models."""
    from gelbridge._adapters.probe import probe_providers

    for f in await probe_providers(settings, environ):
        {"ok": rep.lines, "warning": rep.warnings, "error": rep.problems}[f.level].append(
            f"probe      {f.text}" if f.level == "ok" else f.text)


def _check_defaults(acct: Settings, rep: CheckReport, *, label: str) -> None:
    model = acct.defaults.model
    where = "[defaults]" if label == "[account]" else f"{label} defaults"
    if model is not None and model.provider not in acct.providers:
        known = ", ".join(sorted(acct.providers)) or "none"
        rep.problems.append(f"{where} model: provider {model.provider!r} is not configured in [providers] "
                            f"(configured: {known})")


def _check_bridge_keys(settings: Settings, environ: Mapping[str, str], rep: CheckReport) -> bool:
    """The bridge key files (and ``$GELBRIDGE_BRIDGE_KEY``) load; True when there is one."""
    from gelbridge._grants import load_bridge_keys

    try:
        keys = load_bridge_keys(settings.keyring.bridge_key, environ)
    except GelbridgeError as e:
        rep.problems.append(f"[keyring] bridge_key: {e}")
        return True  # a key is meant to be there: the keyring is not required on top
    for i, k in enumerate(keys):
        role = "current, published at start" if i == 0 else "older, still honoured"
        rep.lines.append(f"bridge key {k.kid} fingerprint {k.fingerprint} ({role})")
    return len(keys) > 0


def _check_keyring(acct: Settings, environ: Mapping[str, str], rep: CheckReport, *, label: str,
                   bridged: bool = False) -> None:
    from gelbridge._errors import KEYRING_ENV
    from gelbridge._sealing import key_advice, load_keyring

    where = "[keyring] path" if label == "[account]" else f"{label} keyring"
    if acct.keyring.path is None and not environ.get(KEYRING_ENV):
        if bridged:
            rep.lines.append(f"keyring    {label}: none (keys come from the apps' key grants)")
        else:
            rep.problems.append(f"{where}: not set: name the keyring file there (or in ${KEYRING_ENV}), "
                                "or set [keyring] bridge_key so apps can grant keys")
        return
    try:
        ring = load_keyring(acct, environ)
    except GelbridgeError as e:
        rep.problems.append(f"{where}: {e}")
        return
    if len(ring) == 0 and not bridged:
        path = acct.keyring.path or environ[KEYRING_ENV]
        rep.problems.append(f"{where}: {path} holds no key: {key_advice(path)}")
        return
    rep.lines.append(f"keyring    {label}: {len(ring)} key(s)")


async def _check_tools(settings: Settings, environ: Mapping[str, str], rep: CheckReport,
                       adapters: AdapterRegistry | None) -> None:
    """The tools and MCP servers of the file, and of every account with MCP servers of its
    own (``[accounts.mcp]``); each default tool list against the tools its account has."""
    names = await _tool_names(settings, environ, rep, mcp_of=dict(settings.mcp), where="")
    if names is None:
        return
    native = native_tool_providers(settings, adapters)
    offered = names | {t for t, providers in native.items() if providers}
    rep.lines.append(f"tools      {', '.join(sorted(offered)) or 'none'}")
    _check_default_tools(settings, rep, "[defaults]", settings.defaults, names, offered, native, adapters)
    seen: dict[str, set[str] | None] = {}  # accounts with the same own servers: started once
    for entry in settings.accounts:
        acct = settings.for_account(entry)
        own_names, own_offered = names, offered
        if entry.mcp is not None:
            label = _label(settings, acct)
            same = json.dumps(acct.mcp, sort_keys=True, default=str)
            if same not in seen:
                seen[same] = await _tool_names(acct, environ, rep, mcp_of=entry.mcp, where=f"{label}: ")
            got = seen[same]
            if got is None:
                continue
            own_names, own_offered = got, got | (offered - names)
            rep.lines.append(f"tools      {label}: {', '.join(sorted(own_offered)) or 'none'}")
        if entry.defaults is not None:
            _check_default_tools(settings, rep, f"[[accounts]] {entry.identifier} defaults", entry.defaults,
                                 own_names, own_offered, native, adapters)
    shares = [("", _share_line(settings.mcp))]
    shares += [(f"{e.label}: ", _share_line({"servers": e.mcp.get("servers", {})})) for e in settings.accounts if e.mcp]
    if any(line for _, line in shares):
        rep.lines.append(f"mcp        {'; '.join(who + line for who, line in shares if line)}")


def _share_line(mcp: Mapping[str, Any]) -> str:
    """``time (one per process), notes (one per account)``: who shares each enabled server."""
    from gelbridge._tools.config import mcp_servers

    try:
        servers = mcp_servers(dict(mcp))
    except GelbridgeError:
        return ""
    return ", ".join(f"{n} (one per {c.share})" for n, c in servers.items() if c.enabled)


async def _tool_names(settings: Settings, environ: Mapping[str, str], rep: CheckReport, *,
                      mcp_of: Mapping[str, Any], where: str) -> set[str] | None:
    """The tools ``settings`` offer (its MCP servers started to list theirs, then stopped);
    a server of ``mcp_of`` that lists none is a problem. None: the tables are wrong."""
    from gelbridge._tools import load_tool_registry
    from gelbridge._tools.config import mcp_servers

    try:
        registry = await load_tool_registry(settings, environ=dict(environ))
    except GelbridgeError as e:
        rep.problems.append(f"{where}[tools]/[mcp]: {e}")
        return None
    names = set(registry.names())
    await registry.aclose()  # the MCP servers were started to list their tools: stop them
    for server, cfg in mcp_servers(dict(mcp_of)).items():
        if cfg.enabled and not any(n.startswith(f"mcp_{server}_") for n in names):
            rep.problems.append(f"{where}[mcp.servers.{server}]: the server did not start or lists no tools "
                                "(its error is in the log above)")
    return names


def _check_default_tools(settings: Settings, rep: CheckReport, where: str, d: DefaultsConfig, names: set[str],
                         offered: set[str], native: dict[str, list[str]], adapters: AdapterRegistry | None) -> None:
    for tool in d.tools:
        if tool in NATIVE_TOOLS:
            _check_native_default(settings, rep, where, tool, native[tool], d.model or settings.defaults.model,
                                  _adapters_with(adapters, tool))
        elif tool not in names:
            rep.problems.append(f"{where} tools: {tool!r} is not a tool here (tools: {', '.join(sorted(offered))})")


def native_tool_providers(settings: Settings, adapters: AdapterRegistry | None) -> dict[str, list[str]]:
    """For each provider-run tool (``web_search``) that the operator has not turned off,
    the configured providers whose adapter can send it (``native_tools``), sorted."""
    from gelbridge._tools.config import builtin_config

    out: dict[str, list[str]] = {}
    for tool in sorted(NATIVE_TOOLS):
        try:
            on = builtin_config(settings.tools, tool).enabled
        except GelbridgeError:
            on = False  # the file check names the bad table
        out[tool] = sorted(name for name, p in settings.providers.items()
                           if on and adapters is not None and p.adapter in adapters
                           and tool in adapters.get(p.adapter).options.native_tools)
    return out


def _adapters_with(adapters: AdapterRegistry | None, tool: str) -> list[str]:
    """The loaded adapters that can send the provider-run tool ``tool``."""
    if adapters is None:
        return []
    return [n for n in adapters.names() if tool in adapters.get(n).options.native_tools]


def _check_native_default(settings: Settings, rep: CheckReport, where: str, tool: str,
                          providers: list[str], model: ModelChoice | None, adapters: list[str]) -> None:
    """A provider-run tool in ``[defaults] tools``: fine when a configured provider's adapter
    can send it; a problem when none can (or it is turned off); a warning when the default
    model's provider cannot (its turns go without it)."""
    have = " or ".join(repr(a) for a in adapters) or "one that declares it in native_tools"
    table = settings.tools.get(tool)
    if isinstance(table, dict) and table.get("enabled") is False:
        rep.problems.append(f"{where} tools: {tool!r} is turned off ([tools.{tool}] enabled = false): "
                            "take it out of tools or turn it on")
        return
    if not providers:
        rep.problems.append(f"{where} tools: {tool!r} is run by the model provider, and no configured provider "
                            f"has it: configure one whose adapter is {have}, or take it out of tools")
        return
    if model is not None and model.provider in settings.providers and model.provider not in providers:
        adapter = settings.providers[model.provider].adapter
        rep.warnings.append(f"{where} tools: {tool!r}: the default model's provider {model.provider!r} "
                            f"(adapter {adapter!r}) has no native {tool}, so its turns go without it "
                            f"(providers that have it here: {', '.join(providers)})")


async def _check_login(acct: Settings, environ: Mapping[str, str], rep: CheckReport, *, label: str) -> None:
    from gelbridge._identity import IdentityError, check_session_did, pds_url_of
    from gelbridge._pds import PdsClient

    a = acct.account
    if not a.identifier:
        return  # accounts_list said so
    password = environ.get(a.password_env)
    if not password:
        rep.problems.append(f"{label} password_env: ${a.password_env} is not set; export an app password in it")
        return
    try:
        url, expected_did = await pds_url_of(a.pds, a.identifier, acct.identity)
    except IdentityError as e:
        rep.problems.append(f"{label}: {e}")
        return
    try:
        async with PdsClient(url) as pds:
            session = await pds.login(a.identifier, password)
            with contextlib.suppress(PdsError):  # the check's own session: not left behind on the PDS
                await pds.logout()
    except PdsAuthError:
        rep.problems.append(f"{label}: the PDS at {url} refused the login of {a.identifier}: check the "
                            f"identifier and the app password in ${a.password_env}")
        return
    except PdsRateLimited as e:
        wait = f" (about {e.retry_after:.0f} s)" if e.retry_after is not None else ""
        rep.problems.append(f"{label}: the PDS at {url} rate-limits the logins of {a.identifier}: "
                            f"try again later{wait}")
        return
    except PdsError as e:
        rep.problems.append(f"{label}: the PDS at {url} does not answer ({type(e).__name__}): check pds = ...")
        return
    try:
        check_session_did(session.did, expected_did, a.identifier, url)
    except IdentityError as e:
        rep.problems.append(f"{label}: {e}")
        return
    how = "" if a.pds else " (resolved from the identifier)"
    rep.lines.append(f"pds        {label}: {url}{how} logged in as {session.handle} ({session.did})")
    if session.main_password:
        rep.warnings.append(f"{label} password_env: ${a.password_env} holds the account's main password: make an "
                            f"app password (your PDS account's settings, App Passwords; Bluesky: Settings > Privacy "
                            f"and security > App passwords) and put it in ${a.password_env}")
