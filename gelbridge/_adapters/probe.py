"""What ``gelbridge check`` (and ``gelbridge run``, before it says ready) asks each provider.

An operator's mistake in ``[providers.*]`` (a base_url nothing answers at, a key the
provider refuses, a path that is not the API, a default model the provider does not
have) would otherwise reach the first user's chat as an error reply. So each provider
gets one authenticated request that costs nothing (a model listing, or the provider's
equivalent), then, where the API has one, a lookup of each default model.

All that is known about providers here is one table, ``FAMILIES`` (built-in adapter name
→ what to ask; ``HOSTS`` for an OpenAI-compatible host whose listing lives elsewhere),
a pure planner (``plan``) and a pure judge (``judge_first``, ``judge_models``): what a
given answer means and what the operator should fix. ``probe_providers`` is the small
shell that sends the requests through ``ProviderTransport`` (no retries, short timeouts,
every provider at once) and returns one ``Finding`` per line. A finding names the
provider, the URL without its query or user info, ``host:port``, the HTTP status and a
known error code; never a key, a header or a provider's message text (OpenAI's 401
message quotes part of the key). docs/adapters.md ("What gelbridge check asks each
provider") has the table for operators, with the providers' documentation.

Custom adapters: a script with a built-in name gets that family's probe; a script that
declares ``adapter.probe = "/path"`` gets a GET of that path, judged as a family's key
check is; ``adapter.probe = false`` (or ``probe = false`` in ``[providers.<name>]``) turns
the check off; any other script gets a plain reach of base_url: a connection that fails
is an error, any HTTP answer is fine (a 401 or 403 a warning).
"""

from __future__ import annotations

import asyncio
import difflib
import json
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from gelbridge._errors import ConfigError, GelbridgeError, ProviderError, ProviderFault

if TYPE_CHECKING:
    from gelbridge._adapters.registry import AdapterRegistry
    from gelbridge._config import ProviderConfig, Settings
    from gelbridge._transport import ProviderTransport

#: seconds: the bound on connecting, and on reading, of one probe request (twice that
#: in all); every provider is asked at once, so a check waits at most about 4x this
PROBE_TIMEOUT = 5.0
#: a model listing larger than this is not read (OpenRouter's is about 1 MB)
PROBE_MAX_BYTES = 16 * 1024 * 1024

Level = Literal["ok", "warning", "error"]


def _data_ids(doc: Any) -> list[str] | None:
    """``{"data": [{"id": ...}]}``: OpenAI, DeepSeek, OpenRouter and the compatible hosts."""
    data = doc.get("data") if isinstance(doc, dict) else None
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
        if isinstance(data, list) else None


def _array_ids(doc: Any) -> list[str] | None:
    """``[{"id": ...}]``: GitHub Models' catalog."""
    return [m["id"] for m in doc if isinstance(m, dict) and isinstance(m.get("id"), str)] \
        if isinstance(doc, list) else None


@dataclass(frozen=True)
class Family:
    """How one API is checked without spending tokens."""

    key: str
    """GET, relative to base_url (or absolute): answers 2xx only for a valid key."""
    proves_key: bool = True
    """False: ``key`` answers without a key too (it proves base_url only)."""
    lookup: str | None = None
    """Per-model lookup (``{model}`` in a GET path; with ``lookup_post``, a POST of
    ``{"model": id}``): 2xx when the provider has the model, 404 when not."""
    lookup_post: bool = False
    listing: str | None = None
    """GET of the model listing, when ``key`` is not one."""
    ids: Callable[[Any], list[str] | None] | None = None
    """The model ids in the listing's JSON (that of ``listing``, else of ``key``)."""
    own_hosts: frozenset[str] = frozenset()
    """The provider's own API hosts: there, a model missing from the listing is an
    error; elsewhere (a proxy, a compatible server) a warning."""
    example: str = ""
    """The base_url of the provider's own API (for the 404 hint)."""
    pulled: bool = False
    """A model the lookup does not find is one to pull (Ollama)."""


_OPENAI = Family(key="/models", ids=_data_ids, own_hosts=frozenset({"api.openai.com"}),
                 example="https://api.openai.com/v1")

#: built-in adapter name → its probe (docs/adapters.md cites each provider's reference)
FAMILIES: dict[str, Family] = {
    # GET /v1/models (Bearer): every model the key may use, fine-tunes and aliases included
    "openai": _OPENAI,
    "openai-responses": _OPENAI,
    # GET /models (Bearer)
    "deepseek": Family(key="/models", ids=_data_ids, own_hosts=frozenset({"api.deepseek.com"}),
                       example="https://api.deepseek.com"),
    # GET /api/v1/key (Bearer) proves the key (the listing needs none); GET /api/v1/models
    # names the catalogue, but not the variants (:nitro, :floor), presets (@preset/...)
    # and routers a request may name: a model missing there is a warning
    "openrouter": Family(key="/key", listing="/models", ids=_data_ids, example="https://openrouter.ai/api/v1"),
    # GET /v1/models (x-api-key, anthropic-version); GET /v1/models/{id} resolves aliases
    "anthropic": Family(key="/v1/models?limit=1", lookup="/v1/models/{model}", example="https://api.anthropic.com"),
    # GET /v1beta/models (x-goog-api-key); GET /v1beta/models/{id} (models.get)
    "gemini": Family(key="/models?pageSize=1", lookup="/models/{model}",
                     example="https://generativelanguage.googleapis.com/v1beta"),
    # GET /api/tags (no key: Ollama has none); POST /api/show: the model is pulled
    "ollama": Family(key="/api/tags", proves_key=False, lookup="/api/show", lookup_post=True, pulled=True,
                     example="http://127.0.0.1:11434"),
}

#: OpenAI-compatible hosts whose model listing is not at base_url + /models
HOSTS: dict[str, Family] = {
    # GitHub Models: base_url https://models.github.ai/inference, catalogue at /catalog/models
    "models.github.ai": Family(key="https://models.github.ai/catalog/models", proves_key=False, ids=_array_ids,
                               example="https://models.github.ai/inference"),
}

#: OpenRouter's model variants (``id:variant``); the listing names the id without them
_OPENROUTER_VARIANTS = frozenset({"nitro", "floor", "online", "exacto", "thinking", "extended"})


@dataclass(frozen=True)
class DefaultModel:
    """A default model of this provider, and where the configuration names it."""

    id: str
    where: str


@dataclass(frozen=True)
class Call:
    """One probe request: ``endpoint`` relative to base_url (or absolute)."""

    method: Literal["GET", "POST"]
    endpoint: str
    model: DefaultModel | None = None


@dataclass(frozen=True)
class Plan:
    """What to ask one provider: ``first`` (base_url and key, or just reachability),
    then ``then`` (the default models), only when ``first`` succeeded."""

    provider: str
    cfg: ProviderConfig
    family: Family | None  # None: a plain reach of base_url (a custom adapter that declares nothing)
    first: Call
    then: tuple[Call, ...] = ()
    declared: bool = False  # the adapter's own ``adapter.probe``
    keyed: bool = False  # a key is sent


@dataclass(frozen=True)
class Finding:
    """One line of the check: ``ok`` (a summary line), ``warning`` or ``error``."""

    level: Level
    text: str


@dataclass(frozen=True)
class Answer:
    """What one probe request got: the 2xx JSON body, or the error."""

    url: str
    body: bytes | None = None
    error: GelbridgeError | None = None
    fault: ProviderFault | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------- pure: plan


def family_for(adapter_name: str, base_url: str, declared: str | None) -> Family | None:
    """The probe for a provider: a ``Family``, or None (a plain reach of base_url).
    ``declared``: the path of the script's ``adapter.probe``."""
    if declared is not None:
        return Family(key=declared)
    host = (urlsplit(base_url).hostname or "").lower()
    if host in HOSTS and adapter_name in ("openai", "openai-responses"):
        return HOSTS[host]
    return FAMILIES.get(adapter_name)


def plan(provider: str, cfg: ProviderConfig, *, declared: str | Literal[False] | None, keyed: bool,
         models: Sequence[DefaultModel]) -> Plan | None:
    """What to ask ``provider`` (None: nothing, ``probe = false`` or ``adapter.probe = false``)."""
    if not cfg.probe or declared is False:
        return None
    fam = family_for(cfg.adapter, cfg.base_url, declared)
    if fam is None:
        return Plan(provider, cfg, None, Call("GET", ""), keyed=keyed)
    then: list[Call] = []
    if fam.lookup is not None:
        then = [Call("POST" if fam.lookup_post else "GET", fam.lookup, m) for m in models]
    elif fam.listing is not None and fam.ids is not None and models:
        then = [Call("GET", fam.listing)]
    return Plan(provider, cfg, fam, Call("GET", fam.key), tuple(then), declared=declared is not None,
                keyed=keyed)


def default_models(settings: Settings) -> dict[str, list[DefaultModel]]:
    """Every default model, by provider: ``[defaults] model`` and each account's own."""
    out: dict[str, list[DefaultModel]] = {}

    def add(provider: str, model_id: str, where: str) -> None:
        got = out.setdefault(provider, [])
        if all(m.id != model_id for m in got):
            got.append(DefaultModel(model_id, where))

    if settings.defaults.model is not None:
        add(settings.defaults.model.provider, settings.defaults.model.id, "[defaults] model")
    for a in settings.accounts:
        if a.defaults is not None and a.defaults.model is not None:
            add(a.defaults.model.provider, a.defaults.model.id, f"[[accounts]] {a.label} defaults model")
    return out


# --------------------------------------------------------------------------- pure: judge


def shown(url: str) -> str:
    """``url`` for a message: no user info, no query (either may hold a key)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _code(fault: ProviderFault) -> str:
    return f" {fault.code}" if fault.code else ""


def judge_first(p: Plan, a: Answer) -> Finding:
    """What the first answer means: an error (what to fix), a warning, or ``ok``."""
    name, fam = f"[providers.{p.provider}]", p.family
    req = f"GET {shown(a.url)}"
    if a.ok:
        if fam is None:
            return Finding("ok", f"{p.provider} ({p.cfg.adapter}): {shown(p.cfg.base_url)} answers")
        key = ("key accepted" if p.keyed and fam.proves_key else
               "no key configured" if fam.proves_key else "this endpoint takes no key")
        return Finding("ok", f"{p.provider} ({p.cfg.adapter}): {req} answered; {key}")
    f = a.fault
    if f is None:  # not a ProviderError: join_url's ConfigError (its text would quote a ?key=)
        return Finding("error", f"{name} base_url: {shown(p.cfg.base_url)!r} is not an http(s) URL with a host; "
                                "write it as https://host/path")
    host = f.host or "the provider"
    fix_url = f"fix base_url (now {shown(p.cfg.base_url)})"
    if f.what == "refused":
        return Finding("error", f"{name} base_url: connection refused at {host} ({req}): nothing listens there; "
                                f"start the provider's server, or {fix_url}")
    if f.what == "dns":
        return Finding("error", f"{name} base_url: the host name {urlsplit(a.url).hostname} does not resolve "
                                f"(DNS); {fix_url}")
    if f.what == "tls":
        why = f" ({f.detail})" if f.detail else ""
        return Finding("error", f"{name} base_url: TLS with {host} failed{why}: check the scheme (a plain "
                                "http:// server cannot be reached with https://) and that the server's "
                                f"certificate is valid for its name; {fix_url}")
    if f.what in ("connect_timeout", "unreachable", "bad_url"):
        why = f" ({f.detail})" if f.detail else ""
        text = "no connection within the connect timeout" if f.what == "connect_timeout" else f"cannot connect{why}"
        return Finding("error", f"{name} base_url: {text} to {host} ({req}); check the host, the port and "
                                f"the network, or {fix_url}")
    if f.what in ("read_timeout", "timeout", "deadline"):
        return Finding("warning", f"{name}: {host} did not answer {req} in time ({f}); it may be slow or down "
                                  "right now (the check goes on)")
    status = f.status or 0
    if fam is None:  # a plain reach: any HTTP answer shows that base_url is served
        if status in (401, 403):
            return Finding("warning", f"{name}: {req} answered HTTP {status}{_code(f)}; if replies then fail "
                                      "with authentication, check the key (declare adapter.probe in the script "
                                      "to have check test it)")
        if f.what == "redirect":
            return Finding("warning", f"{name}: {req} answered with a redirect (HTTP {status}); gelbridge does "
                                      f"not follow redirects: check the scheme and host of base_url")
        return Finding("ok", f"{p.provider} ({p.cfg.adapter}): {shown(p.cfg.base_url)} answers "
                             f"(HTTP {status}; this adapter declares no check of the key)")
    env = f"${p.cfg.api_key_env}" if p.cfg.api_key_env else "no key"
    if status == 401:
        if not p.keyed and p.cfg.api_key_env:
            return Finding("error", f"{name}: {host} wants a key (HTTP 401{_code(f)} on {req}), and adapter "
                                    f"{p.cfg.adapter!r} sends none (its auth is 'none'); use an adapter that "
                                    "sends the key")
        if not p.keyed:
            return Finding("error", f"{name} api_key_env: {host} wants a key (HTTP 401{_code(f)} on {req}); "
                                    "set api_key_env to the variable holding it")
        return Finding("error", f"{name} api_key_env: the provider refused the key in {env} "
                                f"(HTTP 401{_code(f)} on {req}); export a valid key")
    if status == 403:
        return Finding("error", f"{name} api_key_env: the key in {env} has no access (HTTP 403{_code(f)} on "
                                f"{req}): check its permissions, project and region")
    if status == 402:
        return Finding("error", f"{name}: the account has no credit left (HTTP 402{_code(f)} on {req}); "
                                "add credit or raise the key's limit")
    if status == 404:
        where = (f"this adapter's probe path {p.first.endpoint!r} is not there" if p.declared
                 else f"base_url's path is not the API root (for this provider: {fam.example})")
        return Finding("error", f"{name} base_url: {req} answered 404{_code(f)}: {where}; {fix_url}, or set "
                                "probe = false if this host has no such endpoint")
    if f.what == "redirect":
        return Finding("error", f"{name} base_url: {req} answered with a redirect (HTTP {status}): base_url's "
                                f"scheme or host is not the API's (gelbridge does not follow redirects); {fix_url}")
    if f.what in ("not_json", "not_a_stream") and 200 <= status < 300:
        return Finding("error", f"{name} base_url: {req} answered HTTP {status} with a body that is not JSON: "
                                f"base_url points at something that is not the API (a web page?); {fix_url}")
    if status == 400:
        return Finding("error", f"{name}: the provider refused the check request (HTTP 400{_code(f)} on {req}): "
                                "check base_url, the headers and the adapter")
    if status == 429:
        return Finding("warning", f"{name}: {host} rate-limited the check (HTTP 429{_code(f)}); the key was not "
                                  "confirmed")
    return Finding("warning", f"{name}: {req} answered HTTP {status}{_code(f)} ({f}); it may be down right now "
                              "(the check goes on)")


def _wanted(fam: Family, model: str) -> str:
    """The id a listing names for ``model`` (OpenRouter's variants drop their suffix)."""
    base, _, variant = model.rpartition(":")
    if fam.listing is not None and base and variant in _OPENROUTER_VARIANTS:
        return base
    return model


def judge_models(p: Plan, models: Sequence[DefaultModel], answers: Sequence[tuple[Call, Answer]],
                 first: Answer) -> list[Finding]:
    """What the model answers mean: a listing (``first``'s body, or the ``listing``
    call's) searched for each default model, or one lookup per model."""
    fam = p.family
    if fam is None or not models:
        return []
    name = f"[providers.{p.provider}]"
    out: list[Finding] = []
    if fam.lookup is not None:
        for call, a in answers:
            m = call.model
            if m is None:
                continue
            req = f"{call.method} {shown(a.url)}"
            if a.ok:
                out.append(Finding("ok", f"{p.provider}: {m.where} {m.id!r} offered"))
                continue
            f = a.fault
            if f is not None and f.status in (400, 404):
                fix = (f"pull it on that server ('ollama pull {m.id}') or pick a pulled one" if fam.pulled
                       else "pick a model id the provider lists")
                what = "is not pulled on" if fam.pulled else "is not offered by"
                out.append(Finding("error", f"{name} {m.where} {m.id!r} {what} {f.host} (HTTP {f.status}"
                                            f"{_code(f)} on {req}): {fix}"))
            else:
                out.append(Finding("warning", f"{name} {m.where} {m.id!r} could not be looked up "
                                              f"({f or a.error}); the first reply will tell"))
        return out
    if fam.ids is None:
        return []
    source = answers[0][1] if answers else first
    ids = _listed(fam, source)
    host = urlsplit(source.url).hostname or ""
    if ids is None:
        why = f" ({source.fault})" if source.fault else ""
        return [Finding("warning", f"{name}: the model list of {shown(source.url)} could not be read{why}; "
                                   "the default models are not checked")]
    for m in models:
        if m.id.startswith("@"):  # an OpenRouter preset: not in any listing
            out.append(Finding("ok", f"{p.provider}: {m.where} {m.id!r} not checked (a preset)"))
            continue
        if _wanted(fam, m.id) in ids:
            out.append(Finding("ok", f"{p.provider}: {m.where} {m.id!r} listed"))
            continue
        close = difflib.get_close_matches(m.id, ids, n=3, cutoff=0.6)
        hint = f" (close: {', '.join(close)})" if close else ""
        level: Level = "error" if host in fam.own_hosts else "warning"
        tail = ("pick a model id it lists" if level == "error" else
                "if replies then fail with 404, pick a listed id (a proxy or compatible host may accept ids "
                "it does not list)")
        out.append(Finding(level, f"{name} {m.where} {m.id!r} is not among the {len(ids)} models "
                                  f"{shown(source.url)} lists{hint}; {tail}"))
    return out


def _listed(fam: Family, a: Answer) -> list[str] | None:
    if not a.ok or a.body is None or fam.ids is None:
        return None
    try:
        return fam.ids(json.loads(a.body))
    except ValueError:
        return None


# --------------------------------------------------------------------------- shell


async def _ask(transport: ProviderTransport, call: Call, headers: Mapping[str, str]) -> Answer:
    """Send one probe request; never raises for a failure it can name."""
    try:
        url = transport.url(call.endpoint, model=call.model.id if call.model and "{model}" in call.endpoint else None)
    except ConfigError as e:
        return Answer(transport.base_url, error=e)
    try:
        if call.method == "POST":
            body = json.dumps({"model": call.model.id if call.model else ""}).encode()
            data = await transport.post_json(url, body, headers)
        else:
            data = await transport.get_json(url, headers)
    except ProviderError as e:
        return Answer(url, error=e, fault=e.fault)
    except ConfigError as e:
        return Answer(url, error=e)
    return Answer(url, body=data)


async def probe_provider(p: Plan, headers: Mapping[str, str], models: Sequence[DefaultModel], *,
                         timeout: float = PROBE_TIMEOUT, tls: ssl.SSLContext | None = None) -> list[Finding]:
    """Ask one provider what ``p`` says (``headers``: the adapter's and the key's); the
    findings, in order. ``timeout``: the bound on connecting and on reading; a request
    takes at most twice that in all. ``tls``: a TLS context shared by the probes."""
    from gelbridge._transport import ProviderTransport, RetryPolicy

    cfg = p.cfg
    transport = ProviderTransport(
        p.provider, cfg.base_url, headers=cfg.headers, connect_timeout=min(cfg.connect_timeout, timeout),
        read_timeout=timeout, deadline=2 * timeout, retry=RetryPolicy(max_retries=0),
        max_response_bytes=PROBE_MAX_BYTES, max_connections=max(4, len(p.then)), tls=tls)
    async with transport:
        first = await _ask(transport, p.first, headers)
        verdict = judge_first(p, first)
        if verdict.level == "error" or not first.ok:
            return [verdict]
        answers = await asyncio.gather(*(_ask(transport, c, headers) for c in p.then))
    return [verdict, *judge_models(p, models, list(zip(p.then, answers, strict=True)), first)]


async def probe_providers(settings: Settings, environ: Mapping[str, str], *,
                          registry: AdapterRegistry | None = None, timeout: float = PROBE_TIMEOUT) -> list[Finding]:
    """Probe every configured provider at once (each request bounded by ``timeout`` to
    connect and to read, twice that in all). A provider whose adapter is not loaded or
    whose key variable is unset is skipped: ``gelbridge check`` says so on its own line."""
    from gelbridge._adapters.client import provider_auth

    if registry is None:
        from gelbridge._adapters.registry import registry_from_settings

        try:
            registry = registry_from_settings(settings)
        except GelbridgeError:
            return []  # check's [adapters] line says why
    import httpx

    defaults = default_models(settings)
    tls = httpx.create_ssl_context() if settings.providers else None  # one for all (each costs ~0.1 s)
    jobs = []
    skipped: list[Finding] = []
    for name, cfg in settings.providers.items():
        if cfg.adapter not in registry:
            continue
        key = environ.get(cfg.api_key_env) if cfg.api_key_env else None
        if cfg.api_key_env and not key:
            continue
        adapter = registry.get(cfg.adapter)
        try:
            auth = provider_auth(adapter, cfg, key)  # empty: no key, or the adapter sends none
        except ConfigError as e:
            skipped.append(Finding("error", f"[providers.{name}] api_key_env: {e}"))
            continue
        models = defaults.get(name, [])
        p = plan(name, cfg, declared=adapter.options.probe, keyed=bool(auth), models=models)
        if p is None:
            why = "probe = false" if not cfg.probe else "its adapter declares probe = false"
            skipped.append(Finding("ok", f"{name} ({cfg.adapter}): not contacted ({why})"))
            continue
        jobs.append(probe_provider(p, {**adapter.headers, **auth}, models, timeout=timeout, tls=tls))
    found = await asyncio.gather(*jobs)
    return [*skipped, *(f for fs in found for f in fs)]


__all__ = ["FAMILIES", "HOSTS", "PROBE_TIMEOUT", "Answer", "Call", "DefaultModel", "Family",
           "Finding", "Plan", "default_models", "family_for", "judge_first", "judge_models", "plan",
           "probe_provider", "probe_providers", "shown"]
