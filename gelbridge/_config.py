"""Configuration: one TOML file plus environment variables → typed settings.

Lookup order for the file: the ``--config`` option, then ``$GELBRIDGE_CONFIG``, then
``./gelbridge.toml`` in the working directory, then no file (embedded defaults). Environment variables override single keys:

- ``GELBRIDGE_KEYRING``      → ``keyring.path``
- ``GELBRIDGE_STATE_DIR``    → ``state.dir``
- ``GELBRIDGE_STATE_URL``    → ``state.url`` (may carry the password; the file's may not)
- ``GELBRIDGE_PDS``          → ``account.pds``
- ``GELBRIDGE_IDENTIFIER``   → ``account.identifier``

Secrets never live in the file: it names the environment variables that hold them
(``password_env``, ``api_key_env``).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gelbridge._config_keys import key_name, unknown_key_problem
from gelbridge._errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ModelChoice(_Section):
    """A model by provider name (a key of ``[providers]``) and model id."""

    provider: str
    id: str


class AccountConfig(_Section):
    pds: str | None = None
    identifier: str | None = None
    password_env: str = "GELBRIDGE_APP_PASSWORD"


class IdentityConfig(_Section):
    """``[identity]``: how an account without ``pds`` is found (``gelbridge._identity``)."""

    plc_url: str = "https://plc.directory"
    #: a service answering com.atproto.identity.resolveHandle (e.g. https://public.api.bsky.app);
    #: unset: DNS, then https://<handle>/.well-known/atproto-did
    handle_resolver: str | None = None
    timeout: float = Field(10.0, gt=0)


class KeyringConfig(_Section):
    """``[keyring]``: the operator's keyring file (``path``) and the bridge keys apps grant
    conversation keys to (``bridge_key``: one file, or a list whose first is the current
    key and the rest older ones still honoured; PROTOCOL.md §6)."""

    path: Path | None = None
    bridge_key: list[Path] = Field(default_factory=list)

    @field_validator("bridge_key", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, (str, Path)) else v


class ClientConfig(_Section):
    """``[client]``: how ``gelbridge send`` and ``chat`` act as a chat app. ``grant``: each
    new conversation gets a fresh key in the keyring, granted to the bridge published in
    the repo (PROTOCOL.md §6); ``bridge``: that bridge's kid, when several are published;
    ``fingerprint``: the bridge key's fingerprint as its operator gave it (only that key
    is trusted and pinned)."""

    grant: bool = False
    bridge: str | None = None
    fingerprint: str | None = None


class StateConfig(_Section):
    """``[state]``: a SQLite file in ``dir`` (one worker), or a PostgreSQL database at
    ``url`` shared by a fleet of workers (``gelbridge._state``)."""

    dir: Path = Path("~/.local/state/gelbridge")
    #: postgresql://user@host:port/dbname; its password comes from GELBRIDGE_STATE_URL or
    #: PGPASSWORD (libpq), never from the file
    url: str | None = None
    #: seconds: the bound on connecting to Postgres and on any one statement
    timeout: float = Field(5.0, gt=0, le=60)
    #: Postgres connections a worker process keeps at most (statements in flight at once)
    connections: int = Field(4, ge=1, le=64)

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parts = urlsplit(v)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("must be a postgresql://user@host:port/dbname URL (or leave it out for SQLite in dir)")
        if not parts.hostname and "host=" not in (parts.query or ""):
            raise ValueError("must name the host: postgresql://user@host:port/dbname")
        return v


class DefaultsConfig(_Section):
    model: ModelChoice | None = None
    tools: list[str] = Field(default_factory=list)
    effort: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None


class ToolCallIdConfig(_Section):
    """``tool_call_id = { pattern, max_length, exact_length }`` in ``[providers.<name>]``:
    the tool-call ids this host accepts; replaces the adapter's own rule (OpenAI-compatible
    hosts differ: Mistral wants exactly 9 alphanumerics). Checked by ``ModelClient``."""

    pattern: str | None = None
    max_length: int | None = None
    exact_length: int | None = None


#: the OpenAI-style adapters that send a conversation key, and the one host that documents
#: it (auto prompt caching): OpenAI's prompt_cache_key, OpenRouter's session_id
_KEY_HOSTS = {"openai": "api.openai.com", "openai-responses": "api.openai.com", "openrouter": "openrouter.ai"}


class ProviderConfig(_Section):
    """``[providers.<name>]``: ``<name>`` matches ``modelRef.provider``."""

    adapter: str
    base_url: str
    api_key_env: str | None = None
    models: list[str] | None = None
    allow_hosts: list[str] = Field(default_factory=list)
    pass_api_key_to_script: bool = False
    headers: dict[str, str] = Field(default_factory=dict)
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    #: seconds one model call may take in all: every retry and the whole stream included
    #: (a provider trickling keep-alives never outlasts it); ends the reply with ``timeout``
    deadline: float = Field(600.0, gt=0)
    max_retries: int = 3
    #: connections open to this provider at once: a streaming reply holds one for its
    #: whole length, so this bounds the streams in flight (more wait connect_timeout), of
    #: every account of the process that shares this configuration (one model client)
    max_connections: int = Field(1024, ge=1, le=65536)
    tool_call_id: ToolCallIdConfig | None = None
    #: prompt caching: Anthropic cache_control breakpoints, OpenAI prompt_cache_key per
    #: conversation (OpenRouter: the same key as session_id). None (auto): on, except that
    #: the OpenAI-style adapters send the key only to the host that documents it
    #: (api.openai.com; openrouter.ai): another host may refuse the unknown parameter
    prompt_cache: bool | None = None
    #: gelbridge check (and run, before ready) asks the provider whether base_url, the key
    #: and the default models are right (_adapters/probe.py); false: it is not contacted
    probe: bool = True

    def caches_prompts(self) -> bool:
        if self.prompt_cache is not None:
            return self.prompt_cache
        host = _KEY_HOSTS.get(self.adapter)
        if host is not None:
            from urllib.parse import urlsplit

            return (urlsplit(self.base_url).hostname or "") == host
        return True



class AdaptersConfig(_Section):
    dirs: list[Path] = Field(default_factory=list)
    cpu_limit_seconds: float = 2.0
    #: at least 4: the sandbox's own Lua (prelude, JSON, luxkit) needs room to start
    memory_limit_mb: int = Field(64, ge=4, le=65536)
    instruction_limit: int = 200_000_000
    pool_size: int = 4
    #: streams of one adapter that share a Lua runtime, each with its own state table;
    #: they share memory_limit_mb too, and a limit one hits ends the others (1: isolated)
    streams_per_runtime: int = Field(32, ge=1, le=1024)
    engine: Literal["auto", "luajit", "lua54"] = "auto"


class RepliesConfig(_Section):
    """``[replies]``: how replies are written."""

    update_interval: float = 2.0
    #: answer messages the app sent as ``plainContent`` (with a plain reply); false: such a
    #: message gets an error reply, before any model call
    allow_plain: bool = True
    #: the largest putRecord request body the PDS accepts (the reference PDS: 150 KiB of
    #: JSON); a reply is cut to fit one write (finishReason ``length``)
    max_write_bytes: int = Field(150 * 1024, ge=16 * 1024)
    #: PDS write points kept for claims and final writes: progress updates stop while the
    #: PDS says fewer remain before its reset (``ratelimit-remaining``)
    reserve_points: int = Field(100, ge=0)


def is_loopback_host(host: str | None) -> bool:
    """``localhost``, ``::1`` or 127.x: this machine (no relay crawls it; http is fine there)."""
    h = (host or "").lower()
    return h in ("localhost", "::1") or h.startswith("127.")


class RelayConfig(_Section):
    """``[relay]``: a relay's per-host event limits, for a self-hosted PDS. Bluesky's relay
    takes 50 events/s, 2,600/h and 21,000/day from a new PDS host, and every record write
    is an event; progress updates are spaced out, then skipped, as this process's writes
    to the host near them. ``auto``: on unless the PDS is Bluesky-hosted or on loopback."""

    limits: Literal["auto", "on", "off"] = "auto"
    events_per_second: int = Field(50, ge=1)
    events_per_hour: int = Field(2600, ge=1)
    events_per_day: int = Field(21000, ge=1)

    def applies_to(self, pds_url: str) -> bool:
        if self.limits != "auto":
            return self.limits == "on"
        host = (urlsplit(pds_url).hostname or "").lower()
        bluesky = host == "bsky.social" or host.endswith((".bsky.network", ".bsky.social"))
        return not (bluesky or is_loopback_host(host))


class ThreadConfig(_Section):
    max_depth: int = 500
    #: the largest model request a thread may make (its messages, files and images as the
    #: adapter gets them); a larger one ends the turn with an error before any model call.
    #: The adapter's Lua runtime must hold it a few times over ([adapters] memory_limit_mb)
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024)


class FleetConfig(_Section):
    """``[fleet]``: how workers sharing ``[state] url`` split the accounts (``gelbridge._fleet``)."""

    #: seconds a worker's lease on an account lasts without a heartbeat: a dead worker's
    #: accounts are served again this long after its last one (heartbeats every quarter)
    lease_seconds: float = Field(15.0, ge=2, le=600)


class WatchConfig(_Section):
    source: Literal["firehose", "poll", "jetstream"] = "firehose"
    url: str | None = None
    poll_interval: float = 5.0


class WorkerConfig(_Section):
    """``[worker]``: how many turns run at once and how shutdown/recovery behave."""

    concurrency: int = Field(8, ge=1, le=1024)
    shutdown_grace: float = Field(10.0, ge=0)
    stale_claim_after: float | None = Field(900.0, gt=0)
    backfill: bool = True
    #: seconds one reply may take from start to final write: every model call, tool and
    #: step included; ends the reply with ``timeout``
    turn_deadline: float = Field(1800.0, gt=0)


class ObservabilityConfig(_Section):
    """``[observability]``: ``listen = "host:port"`` serves /healthz, /readyz, /metrics;
    ``traces = true`` sends OpenTelemetry traces (the ``otel`` extra) over OTLP/HTTP."""

    listen: str | None = None
    #: connections the listener serves at once; past it, the oldest still sending its request
    #: is answered 503 and closed to make room
    max_connections: int = Field(256, ge=1, le=4096, strict=True)
    #: seconds one request may take, reading it and writing the answer
    request_timeout: float = Field(5.0, gt=0, le=300, strict=True)
    traces: bool = False
    #: OTLP/HTTP traces endpoint; unset: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
    #: http://localhost:4318/v1/traces (the OpenTelemetry SDK's own defaults)
    otlp_endpoint: str | None = None
    service_name: str = "gelbridge"

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is not None:
            split_listen(v)
        return v


def split_listen(listen: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:9464"`` for IPv6) → ``(host, port)``; port 1-65535, or 0
    for any free one. Raises ``ValueError`` saying what is wrong."""
    host, sep, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError('must be "host:port", e.g. "127.0.0.1:9464"')
    if int(port) > 65535:
        raise ValueError(f"port {int(port)} is out of range: 1-65535 (or 0 for any free port)")
    return host, int(port)


class LoggingConfig(_Section):
    """``[logging]``: ``format`` (text or json) and ``level``; the command line and
    ``$GELBRIDGE_LOG_LEVEL`` win over these."""

    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] | None = None


class AccountEntry(_Section):
    """One ``[[accounts]]`` entry: an account served by this process, with its own PDS
    login, keyring, state directory and defaults (strictly separate from the others)."""

    name: str | None = None  # label for logs and the state sub-directory; default: identifier
    pds: str | None = None  # default: resolved from the identifier ([identity])
    identifier: str
    password_env: str = "GELBRIDGE_APP_PASSWORD"
    keyring: Path | None = None
    state_dir: Path | None = None  # default: <state.dir>/accounts/<name>
    defaults: DefaultsConfig | None = None  # keys set here override [defaults]
    #: ``[accounts.mcp.servers.<name>]``: this account's own MCP servers; a server named
    #: here replaces the ``[mcp.servers]`` one of that name for this account only (checked
    #: like ``[mcp]``; ``enabled = false`` turns one off)
    mcp: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return self.name or self.identifier


class ToolsConfig(_Section):
    max_steps: int = 8
    approval_ttl: float | None = None
    call_timeout: float = 60.0
    max_output_chars: int = 20000


class Settings(_Section):
    """Everything gelbridge reads from its configuration."""

    account: AccountConfig = Field(default_factory=AccountConfig)
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    keyring: KeyringConfig = Field(default_factory=KeyringConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    defaults: DefaultsConfig = Field(default_factory=DefaultsConfig)
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    adapters: AdaptersConfig = Field(default_factory=AdaptersConfig)
    replies: RepliesConfig = Field(default_factory=RepliesConfig)
    relay: RelayConfig = Field(default_factory=RelayConfig)
    thread: ThreadConfig = Field(default_factory=ThreadConfig)
    watch: WatchConfig = Field(default_factory=WatchConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    tools: dict[str, Any] = Field(default_factory=dict)
    mcp: dict[str, Any] = Field(default_factory=dict)
    accounts: list[AccountEntry] = Field(default_factory=list)

    @field_validator("providers")
    @classmethod
    def _provider_names(cls, v: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
        for name in v:
            if not name or len(name) > 128:
                raise ValueError(f"provider name {name!r} must be 1-128 characters")
        return v

    @property
    def tools_settings(self) -> ToolsConfig:
        """The ``[tools]`` keys that are not per-tool tables."""
        flat = {k: v for k, v in self.tools.items() if not isinstance(v, dict)}
        return ToolsConfig.model_validate(flat)

    @property
    def state_dir(self) -> Path:
        return self.state.dir.expanduser()

    def accounts_list(self) -> list[AccountEntry]:
        """Every account this process serves: the ``[[accounts]]`` entries, or the single
        ``[account]`` (+ ``[keyring]``, state dir and ``[defaults]``) as a one-entry list."""
        if self.accounts:
            labels = [a.label for a in self.accounts]
            if len(set(labels)) != len(labels):
                raise ConfigError("[[accounts]] names (or identifiers) must be unique; set name = \"...\"")
            if self.account.pds or self.account.identifier:
                raise ConfigError("use either [account] or [[accounts]], not both (move [account] into [[accounts]])")
            return list(self.accounts)
        a = self.account
        if not a.identifier:
            raise ConfigError("set [account] identifier (a handle or DID; or GELBRIDGE_IDENTIFIER), or [[accounts]]")
        return [AccountEntry(pds=a.pds, identifier=a.identifier, password_env=a.password_env,
                             keyring=self.keyring.path, state_dir=self.state.dir)]

    def for_account(self, entry: AccountEntry) -> Settings:
        """These settings narrowed to one account: its ``[account]``, keyring, state dir,
        merged defaults and MCP servers, so one-account code (the worker) serves it unchanged."""
        defaults = self.defaults
        if entry.defaults is not None:
            defaults = self.defaults.model_copy(
                update={k: getattr(entry.defaults, k) for k in entry.defaults.model_fields_set}
            )
        state_dir = entry.state_dir or (self.state.dir / "accounts" / entry.label.replace("/", "_"))
        mcp = self.mcp
        if entry.mcp is not None:
            mcp = {**self.mcp, "servers": {**self.mcp.get("servers", {}), **entry.mcp.get("servers", {})}}
        return self.model_copy(update={
            "account": AccountConfig(pds=entry.pds, identifier=entry.identifier, password_env=entry.password_env),
            "keyring": KeyringConfig(path=entry.keyring, bridge_key=self.keyring.bridge_key),
            "state": self.state.model_copy(update={"dir": state_dir}),
            "defaults": defaults,
            "mcp": mcp,
            "accounts": [],
        })


_ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "GELBRIDGE_KEYRING": ("keyring", "path"),
    "GELBRIDGE_STATE_DIR": ("state", "dir"),
    "GELBRIDGE_STATE_URL": ("state", "url"),
    "GELBRIDGE_PDS": ("account", "pds"),
    "GELBRIDGE_IDENTIFIER": ("account", "identifier"),
}


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The settings model that holds the last key of ``loc`` (a pydantic error location)."""
    model: type[BaseModel] = Settings
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        ann = field.annotation
        args: tuple[Any, ...] = getattr(ann, "__args__", ())
        origin = getattr(ann, "__origin__", None)
        if origin in (dict, list) and parts:
            parts.pop(0)  # the key or index
            ann = args[-1]
        elif origin is not None or args:  # X | None
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def config_problems(err: ValidationError) -> list[str]:
    """Every problem a validation found, one line each (unknown keys with the closest
    valid name)."""
    out: list[str] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            model = _model_at(loc)
            known = [f.alias or n for n, f in model.model_fields.items()] if model is not None else []
            out.append(unknown_key_problem(loc, known))
        else:
            msg = "must be a path (a string)" if e["type"] == "path_type" else e["msg"].removeprefix("Value error, ")
            out.append(f"{key_name(loc) if loc else '(top level)'}: {msg}")
    return out


def _take_table_problems(data: dict[str, Any]) -> list[str]:
    """``[tools]`` and ``[mcp]`` are free-form tables in ``Settings``: check them here, so
    a typo there fails at start-up like any other. What is wrong is taken out of ``data``
    (the rest can still be checked against the world)."""
    from gelbridge._tools.config import BUILTIN_CONFIGS

    out: list[str] = []
    tools = data.get("tools")
    if isinstance(tools, dict):
        flat = {k: v for k, v in tools.items() if not isinstance(v, dict)}
        try:
            ToolsConfig.model_validate(flat)
        except ValidationError as e:
            for er in e.errors():
                loc = ("tools", *er["loc"])
                out.append(unknown_key_problem(loc, list(ToolsConfig.model_fields))
                           if er["type"] == "extra_forbidden" else f"{key_name(loc)}: {er['msg']}")
                tools.pop(er["loc"][0], None)
        for name, table in list(tools.items()):
            if not isinstance(table, dict):
                continue
            if name not in BUILTIN_CONFIGS:
                out.append(unknown_key_problem(("tools", name), list(BUILTIN_CONFIGS)).replace(
                    "unknown key", "not a built-in tool (MCP servers go under [mcp.servers.<name>])", 1))
                del tools[name]
                continue
            try:
                BUILTIN_CONFIGS[name].model_validate(table)
            except ValidationError as e:
                out += [f"[tools.{name}] " + (f"{'.'.join(str(x) for x in er['loc'])}: " if er["loc"] else "")
                        + er["msg"].removeprefix("Value error, ")
                        if er["type"] != "extra_forbidden" else
                        unknown_key_problem(("tools", name, *er["loc"]), list(BUILTIN_CONFIGS[name].model_fields))
                        for er in e.errors()]
                del tools[name]
    out += _take_mcp_problems(data, "")
    accounts = data.get("accounts")
    for i, acct in enumerate(accounts if isinstance(accounts, list) else []):
        if isinstance(acct, dict):
            label = acct.get("name") or acct.get("identifier") or f"#{i + 1}"
            out += _take_mcp_problems(acct, f"[[accounts]] {label}: ")
    return out


def _take_mcp_problems(table: dict[str, Any], where: str) -> list[str]:
    """The problems of ``table["mcp"]`` (the file's, or one account's), each after
    ``where``; a server that has one is taken out."""
    from gelbridge._tools.config import mcp_problems

    mcp = table.get("mcp")
    if not isinstance(mcp, dict):
        return []
    problems = mcp_problems(mcp)
    if problems:
        servers = mcp.get("servers")
        table["mcp"] = {"servers": {n: srv for n, srv in servers.items() if not mcp_problems({"servers": {n: srv}})}
                        if isinstance(servers, dict) else {}}
    return [where + p for p in problems]


_DROPPED: Any = object()


def _drop(data: Any, loc: tuple[Any, ...]) -> bool:
    """Take out of ``data`` what a validation error's ``loc`` points at: the deepest part of
    it that is there (a missing key: the table that lacks it). False: nothing to take."""
    parent: Any = None
    key: Any = None
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node or (
                isinstance(node, list) and type(part) is int and 0 <= part < len(node)):
            parent, key, node = node, part, node[part]
        else:
            break
    if parent is None or node is _DROPPED:
        return False
    if isinstance(parent, dict):
        del parent[key]
    else:
        parent[key] = _DROPPED  # indexes of the other errors stay right; swept out below
    return True


def _sweep(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _sweep(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_sweep(v) for v in data if v is not _DROPPED]
    return data


def _best_effort(data: dict[str, Any]) -> tuple[Settings, list[str]]:
    """The settings and every problem of ``data``: with problems, the settings without the
    keys that have them (their defaults; an entry that lacks a required key: left out), so
    what parsed can still be checked against the world. Takes those keys out of ``data``."""
    try:
        return Settings.model_validate(data), []
    except ValidationError as e:
        problems, err = config_problems(e), e
    rest = data
    for _ in range(64):  # each round takes at least one key out of the file: never reached
        dropped = [_drop(rest, tuple(er["loc"])) for er in err.errors()]
        if not any(dropped):
            break
        rest = _sweep(rest)
        try:
            return Settings.model_validate(rest), problems
        except ValidationError as e:
            err = e
    return Settings(), problems


def _format_validation_error(err: ValidationError, source: str) -> str:
    return _problems_text(source, config_problems(err))


def _problems_text(source: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems)


#: the file looked for in the working directory when neither --config nor $GELBRIDGE_CONFIG names one
DEFAULT_FILE = "gelbridge.toml"
NO_FILE = (f"no config file found (--config FILE, $GELBRIDGE_CONFIG, ./{DEFAULT_FILE}): write one (the README's "
           f"{DEFAULT_FILE} example) and pass it with --config FILE")


@dataclass
class ReadConfig:
    """A configuration as read: ``settings`` (with ``problems``: the best that parsed, the
    keys that have problems at their defaults), ``problems`` of the file (one line each,
    empty: none), and the file it came from (None: no file, embedded defaults)."""

    settings: Settings
    problems: list[str]
    path: Path | None

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else "embedded defaults"


def _in(base: Path, path: Any) -> Any:
    """A relative path in the file, relative to the file (``base``); a value that is not a
    string is left for the validation to name."""
    if isinstance(path, str) and not Path(path).expanduser().is_absolute():
        return str(base / path)
    return path


def read_config(path: str | Path | None = None, *, env: dict[str, str] | None = None) -> ReadConfig:
    """Read settings from a TOML file and the environment, with every problem of the file
    at once. The file: ``path``, else ``$GELBRIDGE_CONFIG``, else ``./gelbridge.toml`` if
    there is one, else none. Raises ConfigError only for a file that cannot be read or
    is not TOML."""
    env = dict(os.environ) if env is None else env
    if path is None and env.get("GELBRIDGE_CONFIG"):
        path = env["GELBRIDGE_CONFIG"]
    if path is None and Path(DEFAULT_FILE).is_file():
        path = Path.cwd() / DEFAULT_FILE
    data: dict[str, Any] = {}
    problems: list[str] = []
    p: Path | None = None
    if path is not None:
        p = Path(path).expanduser().absolute()
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist; pass --config with a TOML file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}") from None
        base = p.parent
        # Relative paths in the file are relative to the file, not the working directory.
        kr = data.get("keyring", {})
        if isinstance(kr, dict) and kr.get("path"):
            kr["path"] = _in(base, kr["path"])
        if isinstance(kr, dict) and isinstance(kr.get("bridge_key"), (str, list)):
            bk = kr["bridge_key"]
            kr["bridge_key"] = [_in(base, b) if isinstance(b, str) else b for b in ([bk] if isinstance(bk, str) else bk)]
        st = data.get("state", {})
        if isinstance(st, dict) and st.get("dir"):
            st["dir"] = _in(base, st["dir"])
        if isinstance(st, dict) and isinstance(st.get("url"), str) and urlsplit(st["url"]).password:
            problems.append("[state] url has a password in it; keep secrets out of the file: "
                            "set GELBRIDGE_STATE_URL (the whole URL) or PGPASSWORD instead")
            del st["url"]
        for acct in data.get("accounts", []) if isinstance(data.get("accounts"), list) else []:
            for k in ("keyring", "state_dir"):
                if isinstance(acct, dict) and acct.get(k):
                    acct[k] = _in(base, acct[k])
        mcp_tables = [data.get("mcp", {})]
        mcp_tables += [a.get("mcp", {}) for a in data.get("accounts", []) if isinstance(a, dict)] if isinstance(
            data.get("accounts"), list) else []
        for mcp in mcp_tables:
            servers = mcp.get("servers", {}) if isinstance(mcp, dict) else {}
            if not isinstance(servers, dict):
                continue
            # stdio MCP servers run in the config file's folder unless told otherwise, so
            # `command = ["python", "server.py"]` next to the config works from anywhere.
            for srv in servers.values():
                if isinstance(srv, dict) and srv.get("command") and not srv.get("url"):
                    cwd = srv.get("cwd")
                    if not cwd:
                        srv["cwd"] = str(base)
                    else:
                        srv["cwd"] = _in(base, cwd)
        ad = data.get("adapters", {})
        if isinstance(ad, dict) and isinstance(ad.get("dirs"), list):
            ad["dirs"] = [_in(base, d) for d in ad["dirs"]]
    for var, (section, key) in _ENV_OVERRIDES.items():
        if env.get(var):
            data.setdefault(section, {})[key] = env[var]
    tables = _take_table_problems(data)
    settings, found = _best_effort(data)
    return ReadConfig(settings, problems + found + tables, p)


def load_config(
    path: str | Path | None = None,
    *,
    env: dict[str, str] | None = None,
) -> Settings:
    """Read settings from a TOML file (``path``, ``$GELBRIDGE_CONFIG`` or ``./gelbridge.toml``;
    none: embedded defaults) and the environment; ConfigError lists every problem."""
    read = read_config(path, env=env)
    if read.problems:
        raise ConfigError(_problems_text(read.source, read.problems))
    return read.settings
