"""MCP servers as tool backends, through the official ``mcp`` SDK (2.x).

One ``McpConnection`` per ``[mcp.servers.<name>]``. Its session lives in a background
task that owns the SDK's context managers (anyio requires entering and leaving them in
one task); calls from any task use the session. Failure handling:

- start-up (spawn, ``initialize``, ``tools/list``) is bounded by ``startup_timeout``;
- every call is bounded by the call timeout and returns an error ``ToolOutput`` on
  timeout, on a server error and on a dead connection - never an exception, never a
  hang;
- a dead connection (process exited, HTTP session gone) is closed, and the next call
  starts the server again;
- ``aclose`` stops the background task (bounded) and with it the process.

Stdio servers get the SDK's minimal default environment (PATH, HOME, ...) plus the
configured ``env`` and the ``env_passthrough`` variables - never gelbridge's full
environment, which holds the app password and provider API keys.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TextIO

from gelbridge._tools.config import McpServerConfig
from gelbridge._tools.registry import ToolOutput

log = logging.getLogger("gelbridge.tools.mcp")

CLOSE_TIMEOUT = 5.0


class McpUnavailable(Exception):
    """The server could not be started or reached (message names the server)."""


@dataclass(frozen=True)
class McpToolInfo:
    """One tool as the server lists it."""

    name: str
    description: str
    parameters: dict[str, Any]


def result_to_output(result: Any) -> ToolOutput:
    """Pure: an MCP ``CallToolResult`` → text for the model.

    Text blocks are joined; embedded text resources are inlined; images, audio and
    binary resources are named, not inlined; with no text at all the structured
    content is returned as JSON.
    """
    texts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind in ("image", "audio"):
            texts.append(f"[{kind} content ({getattr(block, 'mime_type', None) or 'unknown type'}) not shown]")
        elif kind == "resource":
            res = block.resource
            if getattr(res, "text", None) is not None:
                texts.append(res.text)
            else:
                texts.append(f"[binary resource {getattr(res, 'uri', '')} not shown]")
        elif kind == "resource_link":
            texts.append(f"[resource: {getattr(block, 'uri', '')}]")
    structured = getattr(result, "structured_content", None)
    if not texts and structured is not None:
        texts.append(json.dumps(structured, ensure_ascii=False))
    return ToolOutput("\n".join(texts), bool(getattr(result, "is_error", False)))


def _schema(raw: Any) -> dict[str, Any]:
    schema = dict(raw) if isinstance(raw, dict) else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


class McpConnection:
    """A started-on-demand, restarted-on-death connection to one MCP server."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        environ: dict[str, str] | None = None,
        errlog: TextIO | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._environ = dict(os.environ) if environ is None else environ
        self._errlog = errlog
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.tools: list[McpToolInfo] = []
        self.starts = 0  # how many times the server was (re)started; for tests and status

    @property
    def connected(self) -> bool:
        return self._session is not None and self._task is not None and not self._task.done()

    # --- lifecycle -----------------------------------------------------------------------

    async def _open(self, stack: AsyncExitStack) -> Any:
        from mcp import ClientSession

        cfg = self.config
        if cfg.command is not None:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            env = dict(cfg.env)
            for var in cfg.env_passthrough:
                if var in self._environ:
                    env[var] = self._environ[var]
            params = StdioServerParameters(command=cfg.command[0], args=cfg.command[1:], env=env, cwd=cfg.cwd)
            read, write = await stack.enter_async_context(stdio_client(params, errlog=self._errlog or sys.stderr))
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = dict(cfg.headers)
            for header, var in cfg.headers_env.items():
                if var not in self._environ:
                    raise McpUnavailable(f"MCP server {self.name}: environment variable {var} (for {header}) is not set")
                headers[header] = self._environ[var]
            client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
            await stack.enter_async_context(client)
            assert cfg.url is not None
            read, write = await stack.enter_async_context(streamable_http_client(cfg.url, http_client=client))
        return await stack.enter_async_context(ClientSession(read, write))

    async def _list_tools(self, session: Any) -> list[McpToolInfo]:
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        for _page in range(100):
            if cursor is None:
                result = await session.list_tools()
            else:
                from mcp.types import PaginatedRequestParams

                result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
            for t in result.tools:
                tools.append(McpToolInfo(t.name, t.description or "", _schema(t.input_schema)))
            cursor = result.next_cursor
            if not cursor:
                break
        return tools

    async def _run(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                session = await self._open(stack)
                await session.initialize()
                self.tools = await self._list_tools(session)
                self._session = session
                if not ready.done():
                    ready.set_result(None)
                await stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(McpUnavailable(f"MCP server {self.name} did not start in time"))
            raise
        except BaseException as e:  # noqa: BLE001 - the SDK raises ExceptionGroups
            if not ready.done():
                ready.set_exception(McpUnavailable(f"MCP server {self.name} failed to start: {_describe(e)}"))
            else:
                log.warning("MCP server %s: connection ended: %s", self.name, _describe(e))
        finally:
            self._session = None

    async def start(self) -> None:
        """Start (or restart) the server if it is not connected. Raises McpUnavailable."""
        async with self._lock:
            if self.connected:
                return
            await self._shutdown()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()
            stop = asyncio.Event()
            self._stop = stop
            self._task = asyncio.create_task(self._run(ready, stop), name=f"mcp-{self.name}")
            self.starts += 1
            try:
                await asyncio.wait_for(asyncio.shield(ready), timeout=self.config.startup_timeout)
            except TimeoutError:
                await self._shutdown(cancel_now=True)
                if ready.done() and not ready.cancelled():
                    ready.exception()  # retrieved: it is reported below
                log.error("MCP server %s: no answer within %.0f s; its tools fail until it starts",
                          self.name, self.config.startup_timeout)
                raise McpUnavailable(
                    f"MCP server {self.name} did not start within {self.config.startup_timeout:g} s"
                ) from None
            except McpUnavailable as e:
                await self._shutdown()
                log.error("%s", e)
                raise
            log.info("MCP server %s: connected, %d tool(s)", self.name, len(self.tools))

    async def _shutdown(self, *, cancel_now: bool = False) -> None:
        """Stop the background task: politely (stop event) if it is connected, by
        cancellation if it is still starting or does not stop in time."""
        task, self._task = self._task, None
        if self._stop is not None:
            self._stop.set()
        self._session = None
        if task is None or task.done():
            return
        done: set[Any] = set()
        if not cancel_now:
            done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
            if not task.done():
                log.error("MCP server %s: did not shut down", self.name)

    async def aclose(self) -> None:
        async with self._lock:
            await self._shutdown()

    # --- calls -----------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> ToolOutput:
        """Call ``tool`` (the server's real name). Every failure is an error output."""
        try:
            await self.start()
        except McpUnavailable as e:
            return ToolOutput(f"{e}. The tool was not run.", True)
        session = self._session
        if session is None:
            return ToolOutput(f"MCP server {self.name} is not connected. The tool was not run.", True)
        try:
            result = await asyncio.wait_for(
                session.call_tool(tool, arguments, read_timeout_seconds=timeout), timeout=timeout
            )
        except TimeoutError:
            log.warning("MCP server %s: tool %s timed out after %.0f s", self.name, tool, timeout)
            return ToolOutput(f"The tool did not answer within {timeout:g} seconds.", True)
        except Exception as e:  # noqa: BLE001 - connection closed, protocol error, ...
            log.warning("MCP server %s: call to %s failed (%s); restarting on next use",
                        self.name, tool, type(e).__name__)
            async with self._lock:
                if self._session is session:
                    await self._shutdown()
            return ToolOutput(f"MCP server {self.name} failed during the call: {_describe(e)}", True)
        return result_to_output(result)


def _describe(e: BaseException) -> str:
    """One line naming the innermost error (ExceptionGroups unwrapped)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__
