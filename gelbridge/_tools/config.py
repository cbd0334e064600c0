"""Typed views of the ``[tools.<name>]`` and ``[mcp.servers.<name>]`` tables.

``gelbridge._config.Settings`` keeps ``tools`` and ``mcp`` as raw dicts; this module
validates them so that a typo in a tool table fails at start-up with the table's name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gelbridge._config_keys import unknown_key_problem
from gelbridge._errors import ConfigError

Approval = Literal["always", "never"]
Share = Literal["process", "account"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CurrentTimeConfig(_Strict):
    """``[tools.current_time]``."""

    enabled: bool = True
    approval: Approval = "never"


class FetchUrlConfig(_Strict):
    """``[tools.fetch_url]``.

    ``approval`` defaults to ``"always"``: the URL the model chooses leaves the
    encrypted conversation and reaches a third party, so by default the user sees the
    exact URL before it is fetched (a prompt-injected page cannot make the model
    silently send conversation text to another host in a query string).
    """

    enabled: bool = True
    approval: Approval = "always"
    allow_hosts: list[str] = Field(default_factory=list)
    timeout: float = 20.0
    max_bytes: int = 2_000_000
    max_redirects: int = 5
    user_agent: str = "gelbridge-fetch/0.1 (+https://github.com/)"


class WebSearchConfig(_Strict):
    """``[tools.web_search]``: the provider's own web search (OpenAI Responses, Anthropic,
    Gemini), offered when a turn's tools name ``web_search``. The provider runs it, not
    gelbridge, so it needs no approval; the cited pages become ``sourcePart``s.
    ``max_uses`` (Anthropic), ``allowed_domains`` (OpenAI and Anthropic) and
    ``blocked_domains`` (Anthropic) apply where the provider has them."""

    enabled: bool = True
    max_uses: int = Field(5, ge=1, le=50)
    allowed_domains: list[str] = Field(default_factory=list)
    blocked_domains: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_list(self) -> WebSearchConfig:
        if self.allowed_domains and self.blocked_domains:
            raise ValueError("set allowed_domains or blocked_domains, not both (the providers take one)")
        return self

    def options(self) -> dict[str, Any]:
        """The operator's options as a native tool's ``parameters`` (Lux ``kind = web_search``)."""
        out: dict[str, Any] = {"max_uses": self.max_uses}
        if self.allowed_domains:
            out["allowed_domains"] = list(self.allowed_domains)
        if self.blocked_domains:
            out["blocked_domains"] = list(self.blocked_domains)
        return out


class McpToolOverride(_Strict):
    """``[mcp.servers.<server>.tools.<tool>]``."""

    approval: Approval | None = None
    enabled: bool = True


class McpServerConfig(_Strict):
    """``[mcp.servers.<name>]``: either a stdio ``command`` or a streamable-HTTP ``url``.

    Secrets stay out of the file: ``env_passthrough`` names variables copied from
    gelbridge's environment into the server's; ``headers_env`` maps a header to the
    variable holding its value.
    """

    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    env_passthrough: list[str] = Field(default_factory=list)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    headers_env: dict[str, str] = Field(default_factory=dict)
    approval: Approval = "always"
    enabled: bool = True
    startup_timeout: float = 30.0
    #: "process": one server for every account of this process whose configuration of it
    #: is the same (gelbridge._runtime.shared); "account": one per account, for a server
    #: that keeps state between calls (a shared one sees every account's calls)
    share: Share = "process"
    tools: dict[str, McpToolOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of command = [...] (stdio) or url = \"...\" (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError("command must name a program")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self

    @property
    def source(self) -> str:
        """What ``toolCallPart.source`` shows for this server's tools."""
        return self.url if self.url is not None else " ".join(self.command or [])

    def approval_for(self, tool: str) -> Approval:
        override = self.tools.get(tool)
        return override.approval if override and override.approval else self.approval


BUILTIN_CONFIGS: dict[str, type[_Strict]] = {
    "current_time": CurrentTimeConfig,
    "fetch_url": FetchUrlConfig,
    "web_search": WebSearchConfig,
}
#: tools the provider runs itself (Lux tool kinds), not gelbridge: never in the registry
NATIVE_TOOLS = frozenset({"web_search"})


def builtin_config(tools_table: dict[str, Any], name: str) -> Any:
    """The typed ``[tools.<name>]`` table of a built-in tool (defaults when absent)."""
    raw = tools_table.get(name, {})
    try:
        return BUILTIN_CONFIGS[name].model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"[tools.{name}] {where}: {first['msg']}") from None


def check_tool_tables(tools_table: dict[str, Any]) -> None:
    """Every ``[tools.<name>]`` table must name a built-in tool."""
    for key, value in tools_table.items():
        if isinstance(value, dict) and key not in BUILTIN_CONFIGS:
            raise ConfigError(
                f"[tools.{key}] is not a built-in tool (known: {', '.join(sorted(BUILTIN_CONFIGS))}); "
                "MCP servers go under [mcp.servers.<name>]"
            )


def mcp_problems(mcp_table: dict[str, Any]) -> list[str]:
    """Every problem of ``[mcp]``, one line each (empty: it is well-formed)."""
    out = [unknown_key_problem(("mcp", k), ["servers"]) for k in mcp_table if k != "servers"]
    servers = mcp_table.get("servers", {})
    if not isinstance(servers, dict):
        return [*out, "[mcp.servers] must be a table of servers"]
    for name, raw in servers.items():
        if not name or len(name) > 64:
            out.append(f"[mcp.servers] server name {name!r} must be 1-64 characters")
            continue
        try:
            McpServerConfig.model_validate(raw)
        except ValidationError as e:
            for er in e.errors():
                loc = tuple(str(x) for x in er["loc"])
                if er["type"] == "extra_forbidden":
                    out.append(unknown_key_problem(("mcp", "servers", name, *loc), list(McpServerConfig.model_fields)))
                else:
                    msg = er["msg"].removeprefix("Value error, ")
                    out.append(f"[mcp.servers.{name}] {'.'.join(loc) + ': ' if loc else ''}{msg}")
    return out


def mcp_servers(mcp_table: dict[str, Any]) -> dict[str, McpServerConfig]:
    """Parse ``[mcp.servers.*]``; ConfigError with the first of :func:`mcp_problems`."""
    problems = mcp_problems(mcp_table)
    if problems:
        raise ConfigError(problems[0])
    return {name: McpServerConfig.model_validate(raw) for name, raw in mcp_table.get("servers", {}).items()}
