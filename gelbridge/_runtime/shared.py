"""One model client and one set of MCP servers per process, not per account (issue 24).

A process serving 1,000 accounts with a ``ModelClient`` each would keep 1,000 connection
pools and 1,000 sets of Lua runtimes, and start every stdio MCP server 1,000 times.
:class:`SharedClients` hands each account the one built for the part of its narrowed
settings (``Settings.for_account``) that the resource reads, its *key*: accounts with
equal keys share one; an account whose own ``[[accounts]]`` settings change any of it
gets its own. Each is reference counted: the last account that :meth:`releases
<SharedClients.release>` it closes it (in a fleet, accounts come and go).

The keys, from the code that reads the settings:

- **model client** (``ModelClient``, ``registry_from_settings``, ``TransportPool``): all of
  ``[providers]`` and ``[adapters]``, ``[thread] max_request_bytes``, and the values of
  the providers' ``api_key_env`` variables. The client is built from a ``Settings`` that
  holds only these, so it cannot read an account's.
- **MCP server** (``McpConnection``): its name, its ``[mcp.servers.<name>]`` table and
  the values of the variables it is given (``env_passthrough``, ``headers_env``). With
  ``share = "account"`` it is never shared: a stateful server would see every account's
  calls.
- **tool registry** (``load_tool_registry``'s work): the built-in tools' tables
  (``[tools.current_time]``, ``[tools.fetch_url]``), ``[tools] call_timeout``, and the
  keys of its enabled MCP servers, in order (the order names colliding tools). Registries
  with different keys still share the servers they have in common.

What stays per account (the worker's ``TurnDeps``): the tool journal, approvals, keyring,
PDS session and write budget, metrics labels and blob cache. What the shared objects
hold is the configuration's: a model client's API keys, connection pools (which keep no
cookies: ``gelbridge._transport``), tool-call id rules, Lua runtimes (every stream with
its own ``state`` table) and a set of (provider, tool kind) facts already logged; a tool
registry's executors take nothing but their arguments, and an MCP session matches each
answer to the request id of the call that asked, so a result never reaches another
account's call.

A start that fails is not kept: the next account tries again (a registry that left a
server out is that caller's alone, so the next one tries the server again). Callers that
ask for a key while it starts wait for the same start.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TextIO, TypeVar

from gelbridge._config import Settings, ThreadConfig

if TYPE_CHECKING:
    from gelbridge._adapters.client import ModelClient
    from gelbridge._tools.config import McpServerConfig
    from gelbridge._tools.mcp_client import McpConnection
    from gelbridge._tools.registry import ToolRegistry

log = logging.getLogger("gelbridge.runtime.shared")

T = TypeVar("T")

#: the built-in tools a registry holds (``web_search`` is the provider's: not in it)
_REGISTRY_BUILTINS = ("current_time", "fetch_url")


def _digest(value: Any) -> str:
    """A key for ``value`` (JSON-able): a hash, so no secret of the environment is kept in it."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def model_settings(settings: Settings) -> Settings:
    """The part of ``settings`` a model client reads (and nothing an account has of its own)."""
    return Settings(providers=settings.providers, adapters=settings.adapters,
                    thread=ThreadConfig(max_request_bytes=settings.thread.max_request_bytes))


def model_key(settings: Settings, environ: Mapping[str, str]) -> str:
    """The model client's key: ``[providers]``, ``[adapters]``, ``[thread] max_request_bytes``
    and the API keys those providers read."""
    own = model_settings(settings)
    return _digest({
        "providers": {n: p.model_dump(mode="json") for n, p in own.providers.items()},
        "adapters": own.adapters.model_dump(mode="json"),
        "max_request_bytes": own.thread.max_request_bytes,
        "keys": {p.api_key_env: environ.get(p.api_key_env) for p in own.providers.values() if p.api_key_env},
    })


@dataclass(frozen=True)
class ServerPlan:
    """One enabled MCP server of a registry: its ``key`` (None: ``share = "account"``)."""

    name: str
    config: McpServerConfig
    key: str | None


@dataclass(frozen=True)
class ToolsPlan:
    """What a tool registry is built from; ``key`` is None when it holds a server of its own."""

    tools_table: dict[str, Any]
    call_timeout: float
    servers: list[ServerPlan]
    key: str | None


def server_key(name: str, config: McpServerConfig, environ: Mapping[str, str]) -> str | None:
    """An MCP server's key: name, table and the values of the variables it is given."""
    if config.share == "account":
        return None
    given = [*config.env_passthrough, *config.headers_env.values()]
    return _digest({"name": name, "config": config.model_dump(mode="json"),
                    "env": {v: environ.get(v) for v in sorted(set(given))}})


def tools_plan(settings: Settings, environ: Mapping[str, str]) -> ToolsPlan:
    """The registry ``settings`` make (ConfigError for a bad ``[tools]`` or ``[mcp]`` table)."""
    from gelbridge._tools.config import builtin_config, check_tool_tables, mcp_servers

    tools_table: dict[str, Any] = dict(settings.tools)
    check_tool_tables(tools_table)
    call_timeout = float(settings.tools_settings.call_timeout)
    servers = [ServerPlan(n, c, server_key(n, c, environ))
               for n, c in mcp_servers(dict(settings.mcp)).items() if c.enabled]
    key = None
    if all(s.key is not None for s in servers):
        key = _digest({"builtins": {n: builtin_config(tools_table, n).model_dump(mode="json")
                                    for n in _REGISTRY_BUILTINS},
                       "call_timeout": call_timeout, "servers": [[s.name, s.key] for s in servers]})
    return ToolsPlan(tools_table, call_timeout, servers, key)


@dataclass
class _Entry(Generic[T]):
    key: Hashable
    task: asyncio.Task[T]
    users: int = 1


@dataclass
class _Refcounted(Generic[T]):
    """Values by key, each started once (callers during the start wait for it) and closed
    when its last user releases it."""

    what: str
    close: Callable[[T], Awaitable[None]]
    entries: dict[Hashable, _Entry[T]] = field(default_factory=dict)
    held: dict[int, _Entry[T]] = field(default_factory=dict)  # id(value) -> its entry
    closing: set[asyncio.Task[None]] = field(default_factory=set)
    closed: bool = False

    async def acquire(self, key: Hashable, start: Callable[[], Awaitable[T]], *,
                      keep: Callable[[T], bool] | None = None) -> T:
        """The value of ``key``, started by ``start`` unless it is there or starting.
        ``keep(value)`` False: the value is its present callers' only, never found again."""
        if self.closed:
            raise RuntimeError("the shared clients are closed")
        entry = self.entries.get(key)
        if entry is None:
            made: list[_Entry[T]] = []

            async def run() -> T:
                value = await start()
                if keep is not None and not keep(value) and self.entries.get(key) is made[0]:
                    del self.entries[key]  # before any caller is woken: none later finds it
                return value

            entry = _Entry(key, asyncio.ensure_future(run()))
            made.append(entry)
            self.entries[key] = entry
        else:
            entry.users += 1
        try:
            value = await asyncio.shield(entry.task)
        except BaseException:
            self._gone(entry)
            raise
        self.held[id(value)] = entry
        return value

    def _gone(self, entry: _Entry[T]) -> None:
        """A caller that got nothing (the start failed, or it was cancelled while waiting)."""
        entry.users -= 1
        task = entry.task
        failed = task.done() and (task.cancelled() or task.exception() is not None)
        if not failed and entry.users > 0:
            return
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]  # a failed start is not kept; an unwanted one is closed
        if not failed:
            task.add_done_callback(self._close_unwanted)

    def _close_unwanted(self, task: asyncio.Task[T]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        value = task.result()
        if id(value) not in self.held:
            self._background(value)

    def _background(self, value: T) -> None:
        t = asyncio.ensure_future(self._close_one(value))
        self.closing.add(t)
        t.add_done_callback(self.closing.discard)

    async def _close_one(self, value: T) -> None:
        try:
            await self.close(value)
        except Exception as e:  # noqa: BLE001 - one close never stops the others
            log.error("closing a shared %s failed (%s)", self.what, type(e).__name__)

    def users(self, value: T) -> int:
        entry = self.held.get(id(value))
        return entry.users if entry is not None else 0

    async def release(self, value: T) -> bool:
        """One user less; the last closes ``value``. False: not one of ours (or released)."""
        entry = self.held.get(id(value))
        if entry is None:
            return False
        entry.users -= 1
        if entry.users > 0:
            return True
        del self.held[id(value)]
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
        await self._close_one(value)
        return True

    def live(self) -> int:
        """Values started and not closed yet."""
        return len({id(e) for e in (*self.entries.values(), *self.held.values())})

    async def aclose(self) -> None:
        self.closed = True
        entries = {id(e): e for e in (*self.entries.values(), *self.held.values())}.values()
        self.entries.clear()
        self.held.clear()
        for e in entries:
            if not e.task.done():
                e.task.cancel()
        await asyncio.gather(*(e.task for e in entries), return_exceptions=True)
        for e in entries:
            if not e.task.cancelled() and e.task.exception() is None:
                await self._close_one(e.task.result())
        while self.closing:
            await asyncio.gather(*list(self.closing), return_exceptions=True)


class SharedClients:
    """The process's model clients and MCP servers, shared by the accounts whose settings
    give the same key (module docstring). ``environ``: what API keys and MCP servers'
    variables are read from (default ``os.environ``); ``errlog``: stdio servers' stderr.
    ``share=False``: every caller gets one of its own (what each worker did before; for
    comparisons, ``scripts/bench_accounts.py``)."""

    def __init__(self, *, environ: Mapping[str, str] | None = None, errlog: TextIO | None = None,
                 share: bool = True) -> None:
        self._environ = environ
        self._errlog = errlog
        self.share = share
        self._models: _Refcounted[ModelClient] = _Refcounted("model client", self._close_model)
        self._servers: _Refcounted[McpConnection] = _Refcounted("MCP server", self._close_server)
        self._registries: _Refcounted[ToolRegistry] = _Refcounted("tool registry", self._close_registry)
        self._incomplete: set[int] = set()  # id() of registries that left a server out: never shared

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def _key(self, key: str | None) -> Hashable:
        return key if key is not None and self.share else object()  # object(): this caller's own

    # --- model clients -----------------------------------------------------------------------

    async def model_for(self, settings: Settings) -> ModelClient:
        """The model client for ``settings`` (one more user of it)."""
        return await self._models.acquire(self._key(model_key(settings, self.environ)),
                                          lambda: self._new_model(settings))

    async def _new_model(self, settings: Settings) -> ModelClient:
        from gelbridge._adapters.client import ModelClient
        from gelbridge._adapters.registry import registry_from_settings

        own = model_settings(settings)
        return ModelClient(own, registry=registry_from_settings(own), env=self._environ)

    @staticmethod
    async def _close_model(client: ModelClient) -> None:
        await client.aclose()

    # --- tools ---------------------------------------------------------------------------------

    async def tools_for(self, settings: Settings) -> ToolRegistry:
        """The tool registry for ``settings``: built-in tools and the tools of its enabled
        MCP servers (one more user of it). A server that does not start is logged and left
        out, as ``load_tool_registry`` does; that registry is then not shared."""
        plan = tools_plan(settings, self.environ)
        return await self._registries.acquire(self._key(plan.key), lambda: self._build(plan),
                                              keep=lambda r: id(r) not in self._incomplete)

    async def _build(self, plan: ToolsPlan) -> ToolRegistry:
        from gelbridge._tools.loader import builtin_tools, mcp_tools
        from gelbridge._tools.mcp_client import McpUnavailable
        from gelbridge._tools.registry import ToolRegistry

        registry = ToolRegistry(builtin_tools(plan.tools_table))
        tasks = [asyncio.ensure_future(self._server(s)) for s in plan.servers]
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except BaseException:  # cancelled: give back what was got
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for s, t in zip(plan.servers, tasks):
                if not t.cancelled() and t.exception() is None:
                    await self._drop_server(s, t.result())
            raise
        taken = set(registry.names())
        complete = True
        for s, t in zip(plan.servers, tasks):
            exc = t.exception() if not t.cancelled() else asyncio.CancelledError()
            if exc is not None:
                complete = False
                log.error("MCP server %s left out: %s", s.name,
                          str(exc) if isinstance(exc, McpUnavailable) else type(exc).__name__)
                continue
            conn = t.result()
            registry.add_closer(functools.partial(self._drop_server, s, conn))
            for tool in mcp_tools(s.name, conn, call_timeout=plan.call_timeout, taken=taken):
                registry.register(tool)
        if not complete:
            self._incomplete.add(id(registry))
        return registry

    async def _server(self, plan: ServerPlan) -> McpConnection:
        if plan.key is None:
            return await self._start_server(plan)
        return await self._servers.acquire(self._key(plan.key), lambda: self._start_server(plan))

    async def _start_server(self, plan: ServerPlan) -> McpConnection:
        from gelbridge._tools.mcp_client import McpConnection

        conn = McpConnection(plan.name, plan.config, environ=dict(self._environ) if self._environ is not None else None,
                             errlog=self._errlog)
        try:
            await conn.start()
        except BaseException:
            await conn.aclose()
            raise
        return conn

    async def _drop_server(self, plan: ServerPlan, conn: McpConnection) -> None:
        if plan.key is None or not await self._servers.release(conn):
            await conn.aclose()

    @staticmethod
    async def _close_server(conn: McpConnection) -> None:
        await conn.aclose()

    async def _close_registry(self, registry: ToolRegistry) -> None:
        self._incomplete.discard(id(registry))
        await registry.aclose()

    # --- users and the end -----------------------------------------------------------------------

    async def release(self, resource: ModelClient | ToolRegistry) -> None:
        """One user of ``resource`` (from :meth:`model_for` or :meth:`tools_for`) less: the
        last closes it (its MCP servers stop once no other registry holds them)."""
        from gelbridge._tools.registry import ToolRegistry

        if isinstance(resource, ToolRegistry):
            await self._registries.release(resource)
        else:
            await self._models.release(resource)

    def users(self, resource: ModelClient | ToolRegistry) -> int:
        """How many callers hold ``resource`` now (0: not held, or not ours)."""
        from gelbridge._tools.registry import ToolRegistry

        if isinstance(resource, ToolRegistry):
            return self._registries.users(resource)
        return self._models.users(resource)

    def counts(self) -> dict[str, int]:
        """Live model clients, tool registries and shared MCP servers (``share = "process"``)."""
        return {"models": self._models.live(), "registries": self._registries.live(),
                "mcp_servers": self._servers.live()}

    async def aclose(self) -> None:
        """Close everything, held or not (after the workers that use them have stopped)."""
        await self._registries.aclose()  # their servers are released here
        await self._servers.aclose()
        await self._models.aclose()
