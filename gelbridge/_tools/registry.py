"""Tools and the registry the worker chooses from.

A ``Tool`` is a name the model sees, a JSON schema for its arguments, an approval
policy and an async executor. Built-in tools and MCP tools look the same here; the
registry owns the shutdown of whatever the executors hold open (MCP servers).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from gelbridge._terminal import safe_json

Approval = Literal["always", "never"]

#: A tool name: 1-64 of ``A-Za-z0-9_-``, what every provider accepts in a tool's
#: declaration and in a call of the history (OpenAI ``^[a-zA-Z0-9_-]{1,64}$``, Anthropic
#: the same, Bedrock checks the calls of the history too). The only names gelbridge
#: offers (built-in tools, ``mcp_tool_name``); a model's call to any other name is
#: answered as invalid, never run nor asked about (``mapping.response_to_parts``). The
#: lexicon's ``toolCallPart.tool`` allows 128 characters of anything: other apps' names.
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
GENERATED_NAME_MAX = 64
#: The name a call to an invalid name is written with (its error result quotes the name).
INVALID_TOOL_NAME = "invalid_tool_name"


def is_tool_name(name: str) -> bool:
    """True if ``name`` is a valid tool name (:data:`TOOL_NAME_RE`)."""
    return TOOL_NAME_RE.fullmatch(name) is not None


def invalid_name_output(name: str) -> str:
    """The error result of a call to ``name``, which is not a valid tool name: it names
    the call as the model made it (its first 64 characters, every one a terminal could
    interpret as a ``\\u`` escape) and what a name must be."""
    shown = safe_json(name[:64] + ("..." if len(name) > 64 else ""), indent=None)
    return (f"Unknown tool {shown}: not a valid tool name (1-64 of A-Za-z0-9_-), so it was not run. "
            "Call one of the tools offered, by its exact name.")


@dataclass(frozen=True)
class ToolOutput:
    """What an executor returns: text (or JSON-encoded data) and whether it failed."""

    text: str
    is_error: bool = False


Executor = Callable[[dict[str, Any]], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class Tool:
    """One callable tool.

    ``source`` goes into ``toolCallPart.source``: the MCP server URL or command, empty
    for built-ins.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    executor: Executor = field(repr=False, compare=False)
    approval: Approval = "never"
    source: str = ""

    def __post_init__(self) -> None:
        if not is_tool_name(self.name):
            raise ValueError(f"tool name {self.name!r} must be 1-64 characters of A-Za-z0-9_-")
        if self.approval not in ("always", "never"):
            raise ValueError(f"tool {self.name}: approval must be 'always' or 'never'")
        if not isinstance(self.parameters, dict):
            raise ValueError(f"tool {self.name}: parameters must be a JSON schema object")

    def spec(self) -> dict[str, Any]:
        """The declaration sent to the model (Lux IR ``LucentTool``)."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


class ToolRegistry:
    """Tools by name, plus the async closers of their backends."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name} is registered twice; rename one in the configuration")
        self._tools[tool.name] = tool

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        self._closers.append(closer)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def select(self, names: Iterable[str]) -> tuple[list[Tool], list[str]]:
        """The tools named (in order, duplicates dropped) and the names not registered.

        Unknown names are reported, not fatal: a settings record may name a tool this
        operator does not offer.
        """
        tools: list[Tool] = []
        unknown: list[str] = []
        seen: set[str] = set()
        for n in names:
            if n in seen:
                continue
            seen.add(n)
            t = self._tools.get(n)
            if t is None:
                unknown.append(n)
            else:
                tools.append(t)
        return tools, unknown

    def specs(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        tools = list(self._tools.values()) if names is None else self.select(names)[0]
        return [t.spec() for t in tools]

    async def aclose(self) -> None:
        """Stop every backend (MCP servers). Safe to call twice."""
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            await close()


def needs_approval(tool_name: str, registry: ToolRegistry) -> bool:
    """True if a call must wait for the user. Unknown tools count as needing approval
    (they are never executed anyway: see ``execute_calls``)."""
    tool = registry.get(tool_name)
    return tool is None or tool.approval == "always"


def _sanitise(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", part)


def mcp_tool_name(server: str, tool: str, *, taken: Iterable[str] = ()) -> str:
    """``mcp_<server>_<tool>`` in the provider-safe charset, at most 64 characters.

    Characters outside ``A-Za-z0-9_-`` become ``_``. A name that is too long, or that
    collides with one already ``taken`` after sanitising, is cut and given a short hash
    of the real ``server``/``tool`` pair, so the result is stable across restarts.
    """
    name = f"mcp_{_sanitise(server)}_{_sanitise(tool)}"
    taken_set = set(taken)
    if len(name) <= GENERATED_NAME_MAX and name not in taken_set:
        return name
    digest = hashlib.sha256(f"{server}\n{tool}".encode()).hexdigest()[:8]
    return f"{name[: GENERATED_NAME_MAX - 9]}_{digest}"
