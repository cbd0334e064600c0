"""Build the ``ToolRegistry`` from settings: built-ins, then every MCP server's tools."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TextIO

from gelbridge._tools.config import (
    McpServerConfig,
    builtin_config,
    check_tool_tables,
    mcp_servers,
)
from gelbridge._tools.current_time import make_current_time
from gelbridge._tools.fetch_url import Resolver, make_fetch_url, system_resolver
from gelbridge._tools.mcp_client import McpConnection, McpUnavailable
from gelbridge._tools.registry import Tool, ToolOutput, ToolRegistry, mcp_tool_name

log = logging.getLogger("gelbridge.tools")


def builtin_tools(tools_table: dict[str, Any], *, resolver: Resolver = system_resolver) -> list[Tool]:
    """The enabled built-in tools, configured from ``[tools.<name>]``."""
    check_tool_tables(tools_table)
    out: list[Tool] = []
    ct = builtin_config(tools_table, "current_time")
    if ct.enabled:
        out.append(make_current_time(ct))
    fu = builtin_config(tools_table, "fetch_url")
    if fu.enabled:
        out.append(make_fetch_url(fu, resolver=resolver))
    return out


def _mcp_executor(conn: McpConnection, real_name: str, timeout: float) -> Any:
    async def run(args: dict[str, Any]) -> ToolOutput:
        return await conn.call(real_name, args, timeout=timeout)

    return run


def mcp_tools(name: str, conn: McpConnection, *, call_timeout: float, taken: set[str]) -> list[Tool]:
    """Registry entries for a connected server's listed tools (``taken`` is updated)."""
    cfg: McpServerConfig = conn.config
    out: list[Tool] = []
    for info in conn.tools:
        override = cfg.tools.get(info.name)
        if override is not None and not override.enabled:
            continue
        public = mcp_tool_name(name, info.name, taken=taken)
        taken.add(public)
        out.append(
            Tool(
                name=public,
                description=info.description or f"{info.name} (MCP server {name})",
                parameters=info.parameters,
                executor=_mcp_executor(conn, info.name, call_timeout),
                approval=cfg.approval_for(info.name),
                source=cfg.source,
            )
        )
    return out


async def load_tool_registry(
    settings: Any,
    *,
    resolver: Resolver = system_resolver,
    environ: dict[str, str] | None = None,
    errlog: TextIO | None = None,
) -> ToolRegistry:
    """Built-in tools plus the tools of every enabled MCP server (started in parallel).

    A server that fails to start is logged and left out: its tools are then unknown
    names (``ToolRegistry.select`` reports them), and the rest keeps working. Call
    ``await registry.aclose()`` on shutdown to stop the servers.
    """
    tools_table: dict[str, Any] = dict(settings.tools)
    call_timeout = float(settings.tools_settings.call_timeout)
    registry = ToolRegistry(builtin_tools(tools_table, resolver=resolver))
    servers = {n: c for n, c in mcp_servers(dict(settings.mcp)).items() if c.enabled}
    conns = {n: McpConnection(n, c, environ=environ, errlog=errlog) for n, c in servers.items()}
    for conn in conns.values():
        registry.add_closer(conn.aclose)
    results = await asyncio.gather(*(c.start() for c in conns.values()), return_exceptions=True)
    taken = set(registry.names())
    for (name, conn), result in zip(conns.items(), results):
        if isinstance(result, BaseException):
            reason = str(result) if isinstance(result, McpUnavailable) else type(result).__name__
            log.error("MCP server %s left out: %s", name, reason)
            continue
        for tool in mcp_tools(name, conn, call_timeout=call_timeout, taken=taken):
            registry.register(tool)
    return registry
