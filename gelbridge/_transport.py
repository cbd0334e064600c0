"""HTTP between the adapters and the model providers: framing, errors, retries, clients.

A functional core (pure, no I/O) plus one imperative shell:

- ``SSEDecoder`` / ``NDJSONDecoder``: incremental stream framing (hot path, ~µs/event).
- ``join_url``, ``auth_headers``, ``default_auth_style``: building requests.
- ``error_from_response``, ``parse_retry_after``: provider answers → ``ProviderError``.
- ``RetryPolicy``: which failures are retried, and after how long.
- ``ProviderTransport`` (one pooled ``httpx.AsyncClient`` per provider) and
  ``TransportPool`` (one transport per configured provider, closed together).

Decisions (each one is tested in ``tests/transport/``):

SSE
  WHATWG event-stream rules: ``\\r\\n``, ``\\n`` and ``\\r`` end lines (a ``\\r\\n`` split
  across two reads is one line end); a leading BOM is dropped; invalid UTF-8 becomes
  U+FFFD; ``:`` lines are comments (``: keep-alive``, ``: OPENROUTER PROCESSING``);
  one space after the colon is removed; ``data`` lines join with ``\\n``; a blank line
  dispatches; ``retry:`` and unknown fields are ignored; ``id`` persists across events
  like the browser's ``lastEventId`` (an id containing NUL is ignored). ``event`` is
  ``None`` when the stream names none. A ``data:`` line with an empty value yields an
  event with ``data == ""`` (as in the spec); ``ProviderTransport.stream`` skips those
  empty keep-alives. ``[DONE]`` is ordinary data for the decoder.
  ``close()`` differs from the spec on purpose: the spec discards an event that is not
  followed by a blank line, but some providers end the body right after the last
  ``data:`` line, so ``close()`` treats an unterminated last line as complete and
  dispatches the pending event.

NDJSON (Ollama ``/api/chat``)
  Lines end with ``\\n`` (a trailing ``\\r`` is removed); blank lines are skipped; a
  partial trailing line is kept until more data arrives or ``close()``; a leading BOM
  is dropped; a line longer than ``max_line_bytes`` (16 MiB) is an error.

Line and event bounds
  16 MiB each (``DEFAULT_MAX_LINE_BYTES``, ``DEFAULT_MAX_EVENT_CHARS``): far above what a
  provider sends in one line (a Responses ``response.completed`` event repeats the whole
  answer with every citation; 5,000 citations are over 1 MiB), still bounded (the
  official ``openai`` and ``anthropic`` SDKs set no limit at all). A line arriving in
  many reads is kept in pieces and joined once. Over the bound: one ``server_error``
  (HTTP 200, fault ``bad_stream`` with detail ``LINE_TOO_LONG`` or ``EVENT_TOO_LARGE``).

URLs
  ``join_url`` keeps the base URL's path (``https://host/openai/v1`` +
  ``/chat/completions``), never doubles or drops the slash between them, and merges the
  query strings of the base URL, the endpoint (``:streamGenerateContent?alt=sse``) and
  ``query`` (later ones win for the same key). ``{model}`` is replaced by the model id
  percent-encoded as ONE path segment: ``/`` becomes ``%2F``. Model ids with ``/``
  (OpenRouter ``anthropic/claude-3.5``) belong in request bodies, not paths; for Gemini
  pass the bare id (``gemini-2.0-flash``), not ``models/gemini-2.0-flash``. An endpoint
  that is already an absolute ``http(s)://`` URL is used as it is (host allow-listing
  is the adapter host's job).

Errors
  Kind from the status first (401/403 authentication, 429 rate_limit, 408 timeout,
  other 4xx and 3xx invalid_request, 5xx and 529 server_error), then refined from the
  provider's error body (OpenAI, Anthropic, Gemini, Ollama, OpenRouter shapes):
  content-policy codes become content_filter. The message is one line: status, the
  provider's own ``message`` (at most 300 characters; never other body fields, which
  may echo the request, such as OpenRouter's ``flagged_input``) and what to do.
  ``retry_after`` comes from ``retry-after-ms``, then ``Retry-After`` (seconds or an
  HTTP date), then, for 429 only, OpenAI's ``x-ratelimit-reset-*`` durations.
  A 2xx non-stream body that is not JSON raises ``ProviderError(kind="server_error",
  status=<2xx>)``: the request was accepted, something in front of the API (a proxy,
  a web page at a wrong base_url) answered wrongly. It is not retried.
  Every ``ProviderError`` of the shell carries a ``fault`` (``ProviderFault``): what
  happened in a fixed vocabulary (connection refused, DNS, TLS with OpenSSL's reason,
  a timeout, HTTP status with the provider's code when it is a known one, a body that
  is not JSON...), the provider's name and ``host:port``. That, never the message, is
  what a log line may say (``gelbridge._errors.failure_of``).

Retries (``RetryPolicy``; the transport is the ONLY retry owner — disable SDK retries)
  Retried: 429, 5xx (incl. 529), and transport failures (cannot connect, timeouts,
  connection dropped) before any byte of a 2xx body was received. Never retried: any
  other status (400/401/403/404/413/422/…), OpenAI ``insufficient_quota`` (a 429 that
  waiting does not fix), and anything after a stream has started. Back-off:
  ``min(max_delay, base_delay·2^(n-1))`` reduced by up to ``jitter`` (a fraction).
  ``Retry-After`` is honoured exactly when it is at most ``retry_after_ceiling``
  (default ``max_delay``); a longer one is not waited for: the error surfaces so the
  caller (fallback to another provider) decides. A total ``deadline`` also stops
  retries whose wait would overrun it.

Streams
  ``ProviderTransport.stream`` returns a ``ProviderStream``: an async iterator of data
  payloads (SSE) or lines (NDJSON). ``[DONE]`` is not yielded: it sets ``saw_done`` and
  ends the iteration (the rest of the body is drained, bounded, so the connection goes
  back to the pool). A body that ends cleanly without ``[DONE]`` just ends the
  iteration with ``saw_done=False`` and ``ended_cleanly=True`` — whether that is
  complete is the adapter's decision (Anthropic and Gemini never send ``[DONE]``). A
  transport failure after the first byte raises ``ProviderError(kind="server_error",
  "stream ended early …")``, or ``kind="timeout"`` when no data came for ``read_timeout``
  seconds or the total ``deadline`` passed. A 2xx ``application/json`` body where SSE was
  asked for raises ``ProviderError`` (with the provider's message, if any) instead of
  ending silently with no events. Use it as ``async with transport.stream(...)
  as s: async for data in s: ...`` so an early exit returns the connection.

Timing
  ``TransportTiming``: attempts, status, ``ttfb`` (call start → first body byte, so it
  includes retries and their waits), ``total`` and ``retry_wait`` in seconds, and bytes
  received. ``post_json`` fills one passed as ``timing=``; a ``ProviderStream`` has
  ``.timing``.
"""

from __future__ import annotations

import asyncio
import codecs
import email.utils
import json
import logging
import math
import os
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from http.cookiejar import CookieJar, DefaultCookiePolicy
from types import TracebackType
from typing import Any, Literal, NamedTuple
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import httpx

from gelbridge._backoff import backoff_delay
from gelbridge._config import ProviderConfig
from gelbridge._errors import ConfigError, ProviderError, ProviderFault

__all__ = [
    "AuthStyle",
    "Framing",
    "NDJSONDecoder",
    "ProviderStream",
    "ProviderTransport",
    "RetryPolicy",
    "SSEDecoder",
    "SSEEvent",
    "TransportPool",
    "TransportTiming",
    "auth_headers",
    "connect_fault",
    "default_auth_style",
    "error_from_response",
    "host_port",
    "is_retryable",
    "join_url",
    "parse_retry_after",
]

log = logging.getLogger("gelbridge.transport")

MiB = 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 16 * MiB
DEFAULT_MAX_EVENT_CHARS = 16 * MiB
DEFAULT_MAX_RESPONSE_BYTES = 64 * MiB
DEFAULT_MAX_ERROR_BODY_BYTES = 64 * 1024
MESSAGE_LIMIT = 300

AuthStyle = Literal["bearer", "x-api-key", "x-goog-api-key", "none"]
Framing = Literal["sse", "ndjson"]
#: Content types of newline-delimited JSON streams: read as NDJSON whatever framing the
#: adapter expects (``ProviderStream``).
NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines")


def _bound(n: int, unit: str) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} {unit}"


def _framing_error(message: str, detail: str | None = None) -> ProviderError:
    """A 2xx stream gelbridge cannot read; ``detail``: which bound it broke (a fixed name)."""
    return ProviderError(message, kind="server_error", status=200,
                         fault=ProviderFault("bad_stream", status=200, detail=detail))


# ======================================================================================
# SSE
# ======================================================================================


class SSEEvent(NamedTuple):
    """One dispatched server-sent event. ``event`` is None when the stream names none."""

    event: str | None
    data: str
    id: str | None


_new_tuple = tuple.__new__  # builds an SSEEvent without NamedTuple's Python-level __new__


def _utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")("replace")


class SSEDecoder:
    """Incremental WHATWG ``text/event-stream`` decoder: bytes in, events out."""

    __slots__ = ("_inc", "_line", "_more", "_line_len", "_skip_lf", "_data", "_data_len", "_event", "_last_id",
                 "max_line_chars", "max_event_chars")

    def __init__(
        self,
        *,
        max_line_chars: int = DEFAULT_MAX_LINE_BYTES,
        max_event_chars: int = DEFAULT_MAX_EVENT_CHARS,
    ) -> None:
        # Decoding: an incremental decoder only while it is needed (stream start, for a
        # BOM split across reads; a character split across reads; invalid bytes), else
        # plain bytes.decode, which is several times faster on the hot path.
        self._inc: codecs.IncrementalDecoder | None = codecs.getincrementaldecoder("utf-8-sig")("replace")
        self._line = ""          # unterminated tail of the last read
        self._more: list[str] = []  # reads after it that end no line (a long line: joined once)
        self._line_len = 0
        self._skip_lf = False    # last read ended in \r: a leading \n is its pair
        self._data: list[str] = []
        self._data_len = 0
        self._event: str | None = None
        self._last_id: str | None = None
        self.max_line_chars = max_line_chars
        self.max_event_chars = max_event_chars

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Decode one read; return the events it completed (often none or one)."""
        inc = self._inc
        if inc is None:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                inc = self._inc = _utf8_decoder()
                text = inc.decode(data)
        else:
            text = inc.decode(data)
            pending, first = inc.getstate()
            if not pending and not first:
                self._inc = None
        if not text:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if "\r" in text:
            self._skip_lf = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if self._line:
            if "\n" not in text:  # the middle of a long line: kept in pieces, joined when it ends
                self._line_len += len(text)
                if self._line_len > self.max_line_chars:
                    raise self._too_long()
                self._more.append(text)
                return []
            text = self._line + ("".join(self._more) + text if self._more else text)
            self._more = []
        lines = text.split("\n")
        tail = lines.pop()
        if len(tail) > self.max_line_chars:
            raise self._too_long()
        self._line = tail
        self._line_len = len(tail)
        if not lines:
            return []
        return self._lines(lines)

    def _too_long(self) -> ProviderError:
        return _framing_error(
            f"event-stream line longer than {_bound(self.max_line_chars, 'characters')}, gelbridge's bound "
            "(or the provider is not sending server-sent events)",
            "LINE_TOO_LONG")

    def close(self) -> list[SSEEvent]:
        """End of body: flush the decoder, treat an unterminated line as complete and
        dispatch a pending event (providers sometimes omit the final blank line)."""
        text = self._inc.decode(b"", True) if self._inc is not None else ""
        self._inc = None
        lines: list[str] = []
        if text:
            if self._skip_lf and text[0] == "\n":
                text = text[1:]
            text = text.replace("\r\n", "\n").replace("\r", "\n")
            text = self._line + "".join(self._more) + text
            lines = text.split("\n")
            tail = lines.pop()
        else:
            tail = self._line + "".join(self._more)
        if tail:
            lines.append(tail)
        lines.append("")
        self._line = ""
        self._more = []
        self._line_len = 0
        self._skip_lf = False
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if line.startswith("data: "):  # fast path: nearly every provider line
                value = line[6:]
                data.append(value)
                self._data_len += len(value)
                continue
            if not line:
                if data:
                    if self._data_len > self.max_event_chars:
                        raise self._too_large()
                    events.append(_new_tuple(SSEEvent, (self._event, "\n".join(data), self._last_id)))
                    data = self._data = []
                    self._data_len = 0
                self._event = None
                continue
            colon = line.find(":")
            if colon == 0:
                continue  # comment / keep-alive
            if colon < 0:
                name, value = line, ""
            else:
                name = line[:colon]
                value = line[colon + 1:]
                if value[:1] == " ":
                    value = value[1:]
            if name == "data":
                data.append(value)
                self._data_len += len(value)
            elif name == "event":
                self._event = value or None
            elif name == "id":
                if "\x00" not in value:
                    self._last_id = value
            # "retry" and unknown fields are ignored
        if self._data_len > self.max_event_chars:
            raise self._too_large()
        return events

    def _too_large(self) -> ProviderError:
        return _framing_error(f"server-sent event larger than {_bound(self.max_event_chars, 'characters')}",
                              "EVENT_TOO_LARGE")


# ======================================================================================
# NDJSON
# ======================================================================================


class NDJSONDecoder:
    """Incremental newline-delimited JSON framing (lines are returned, not parsed)."""

    __slots__ = ("_buf", "_buf_len", "_first", "max_line_bytes")

    def __init__(self, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._buf: list[bytes] = []  # the unterminated last line so far, in pieces (joined once)
        self._buf_len = 0
        self._first = True
        self.max_line_bytes = max_line_bytes

    def feed(self, data: bytes) -> list[str]:
        """Add one read; return the complete non-blank lines it finished."""
        if b"\n" not in data:
            self._buf_len += len(data)
            if self._buf_len > self.max_line_bytes:
                raise self._too_long()
            self._buf.append(data)
            return []
        if self._buf:
            self._buf.append(data)
            data = b"".join(self._buf)
        parts = data.split(b"\n")
        tail = parts.pop()
        if len(tail) > self.max_line_bytes:
            raise self._too_long()
        self._buf = [tail] if tail else []
        self._buf_len = len(tail)
        return self._emit(parts)

    def close(self) -> list[str]:
        """End of body: the unterminated last line, if any, is a line."""
        tail = b"".join(self._buf)
        self._buf, self._buf_len = [], 0
        return self._emit([tail]) if tail else []

    def _emit(self, parts: list[bytes]) -> list[str]:
        out: list[str] = []
        limit = self.max_line_bytes
        for raw in parts:
            if len(raw) > limit:
                raise self._too_long()
            line = raw.decode("utf-8", "replace")
            if self._first:
                self._first = False
                if line[:1] == "\ufeff":
                    line = line[1:]
            if line.endswith("\r"):
                line = line[:-1]
            if line and not line.isspace():
                out.append(line)
        return out

    def _too_long(self) -> ProviderError:
        return _framing_error(
            f"NDJSON line longer than {_bound(self.max_line_bytes, 'bytes')}, gelbridge's bound "
            "(or the provider is not sending newline-delimited JSON)", "LINE_TOO_LONG")


# ======================================================================================
# URLs and auth
# ======================================================================================

# RFC 3986 pchar minus "/" and "%": a model id always stays one path segment.
_SEGMENT_SAFE = "-._~:@!$&'()*+,;="


def join_url(
    base_url: str,
    endpoint: str,
    *,
    model: str | None = None,
    query: Mapping[str, str] | None = None,
) -> str:
    """Base URL + endpoint (+ ``{model}``) + merged query strings; see module docstring."""
    if "{model}" in endpoint:
        if not model or model in (".", ".."):
            raise ConfigError(
                f"endpoint {endpoint!r} needs a model id; set the model of the request"
            )
        endpoint = endpoint.replace("{model}", quote(model, safe=_SEGMENT_SAFE))
    if endpoint.startswith(("http://", "https://")):
        base = urlsplit(endpoint)
        path, ep_query = base.path, ""
        base_query = base.query
    else:
        base = urlsplit(base_url)
        if base.scheme not in ("http", "https") or not base.netloc:
            raise ConfigError(
                f"base_url {base_url!r} is not an http(s) URL with a host; "
                "fix base_url in the provider's configuration"
            )
        ep_path, _, ep_query = endpoint.partition("?")
        ep_path = ep_path.partition("#")[0]
        path = base.path.rstrip("/")
        if ep_path:
            path = path + "/" + ep_path.lstrip("/")
        path = path or "/"
        base_query = base.query
    pairs = parse_qsl(base_query, keep_blank_values=True) + parse_qsl(
        ep_query, keep_blank_values=True
    )
    if query:
        pairs += [(k, str(v)) for k, v in query.items()]
    merged: dict[str, str] = {}
    for k, v in pairs:
        merged.pop(k, None)  # later wins, and moves to the later position
        merged[k] = v
    return urlunsplit((base.scheme, base.netloc, path, urlencode(merged, quote_via=quote), ""))


_AUTH_BY_ADAPTER: dict[str, AuthStyle] = {
    "openai": "bearer",
    "openai-compatible": "bearer",
    "deepseek": "bearer",
    "mistral": "bearer",
    "groq": "bearer",
    "github": "bearer",
    "openrouter": "bearer",
    "anthropic": "x-api-key",
    "gemini": "x-goog-api-key",
    "ollama": "none",
}


def default_auth_style(adapter: str) -> AuthStyle:
    """Auth style for an adapter name. Unknown adapters get ``bearer`` (the common case,
    and what the Go host did); Anthropic's ``anthropic-version`` is the adapter's header."""
    return _AUTH_BY_ADAPTER.get(adapter.lower(), "bearer")


def auth_headers(style: AuthStyle, key: str | None) -> dict[str, str]:
    """The header carrying ``key``; empty when there is no key (local servers)."""
    if style == "none" or not key:
        return {}
    if any(c in key for c in "\r\n\x00"):
        raise ConfigError("the API key contains a line break; re-export it without one")
    if style == "bearer":
        return {"Authorization": f"Bearer {key}"}
    if style == "x-api-key":
        return {"x-api-key": key}
    if style == "x-goog-api-key":
        return {"x-goog-api-key": key}
    raise ConfigError(f"unknown auth style {style!r}; use bearer, x-api-key, x-goog-api-key or none")


# ======================================================================================
# Errors
# ======================================================================================

_CONTENT_FILTER_CODES = frozenset({
    "content_filter",
    "content_policy_violation",
    "content_policy",
    "responsibleaipolicyviolation",
    "moderation_blocked",
})

_HINTS = {
    "authentication": "check the API key (the provider's api_key_env) and its permissions",
    "rate_limit": "wait and retry, or lower the request rate",
    "invalid_request": "the provider rejected the request; check the model id, base_url and parameters",
    "server_error": "the provider failed; try again later or use another provider",
    "content_filter": "the provider's content policy blocked the request; rephrase it",
    "timeout": "the provider was too slow; try again or raise the timeout",
}

_WS = re.compile(r"\s+")


def _one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = _WS.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _lower_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if not headers:
        return {}
    return {k.lower(): v for k, v in headers.items()}


_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _parse_go_duration(text: str) -> float | None:
    """OpenAI's ``x-ratelimit-reset-*`` values: ``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``."""
    text = text.strip()
    pos, total = 0, 0.0
    for m in _GO_DURATION.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    return total if pos and pos == len(text) else None


def parse_retry_after(
    headers: Mapping[str, str] | None, *, status: int | None = None, now: float | None = None
) -> float | None:
    """Seconds to wait, from ``retry-after-ms``, ``Retry-After`` (seconds or HTTP date),
    or (429 only) ``x-ratelimit-reset-requests/-tokens``. None when absent or unreadable."""
    h = _lower_headers(headers)
    ms = h.get("retry-after-ms")
    if ms is not None:
        try:
            v = float(ms) / 1000.0
            if math.isfinite(v):
                return max(0.0, v)
        except ValueError:
            pass
    ra = h.get("retry-after")
    if ra is not None:
        ra = ra.strip()
        try:
            v = float(ra)
            if math.isfinite(v):
                return max(0.0, v)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(ra)
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None and when.tzinfo is not None:
                now = time.time() if now is None else now
                return max(0.0, when.timestamp() - now)
    if status == 429:
        resets: list[tuple[str, float]] = []
        for dim in ("requests", "tokens"):
            raw = h.get(f"x-ratelimit-reset-{dim}")
            d = _parse_go_duration(raw) if raw else None
            if d is not None:
                resets.append((dim, d))
        if resets:
            exhausted = [d for dim, d in resets if h.get(f"x-ratelimit-remaining-{dim}", "").strip() == "0"]
            return max(exhausted) if exhausted else min(d for _, d in resets)
    return None


def _kind_for_status(status: int) -> str:
    if status in (401, 403):
        return "authentication"
    if status == 429:
        return "rate_limit"
    if status == 408:
        return "timeout"
    if status >= 500:
        return "server_error"
    return "invalid_request"


def _provider_fields(body: bytes) -> tuple[str | None, str | None, bool]:
    """(message, code, flagged) from the known provider error shapes."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None, False
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        doc = doc[0]  # Gemini streamGenerateContent wraps errors in a list
    if not isinstance(doc, dict):
        return None, None, False
    err = doc.get("error")
    if isinstance(err, str):  # Ollama {"error": "..."}
        return err, None, False
    if isinstance(err, dict):
        msg = err.get("message")
        codes = [err.get(k) for k in ("code", "type", "status")]
        # OpenAI: code/type strings; Anthropic: error.type; Gemini: status; OpenRouter: code int
        code = next((c for c in codes if isinstance(c, str) and c), None)
        meta = err.get("metadata")
        flagged = isinstance(meta, dict) and ("reasons" in meta or "flagged_input" in meta)
        inner = err.get("innererror")
        if isinstance(inner, dict) and isinstance(inner.get("code"), str):
            codes.append(inner["code"])  # Azure: ResponsibleAIPolicyViolation
        if any(isinstance(c, str) and c.lower() in _CONTENT_FILTER_CODES for c in codes):
            flagged = True
        if code is None and isinstance(err.get("code"), int):
            code = str(err["code"])
        return (msg if isinstance(msg, str) else None), code, flagged
    msg = doc.get("message") or doc.get("detail")
    return (msg if isinstance(msg, str) else None), None, False


#: ``(status, body) → {kind?, message?, code?} | None``: an adapter's reading of an error
#: answer (the optional ``transform_error`` hook); None: the host's own parsing.
ErrorHook = Callable[[int, bytes], "Mapping[str, str] | None"]


def error_from_response(
    status: int, body: bytes, headers: Mapping[str, str] | None, *, now: float | None = None,
    hook: ErrorHook | None = None,
) -> ProviderError:
    """Map a non-2xx provider answer to a ``ProviderError`` (see module docstring).
    ``hook`` (the adapter's ``transform_error``) may say what the body means; a field it
    leaves out, or a hook that fails, falls back to the shapes the host knows."""
    h = _lower_headers(headers)
    kind = _kind_for_status(status)
    message, code, flagged = _provider_fields(body)
    if flagged and 400 <= status < 500 and status != 429:
        kind = "content_filter"
    said = _hooked(hook, status, body)
    if said:
        if said.get("kind") in _HINTS:
            kind = said["kind"]
        message = said.get("message") or message
        code = said.get("code") or code
    if 300 <= status < 400:
        loc = h.get("location", "")
        message = f"redirected to {_one_line(loc, 120)}" if loc else "redirected"
        hint = "check base_url (scheme, host and path; redirects are not followed)"
    elif status == 404:
        hint = "check base_url and the model id"
    else:
        hint = _HINTS[kind]
    if message is None and body:
        ctype = h.get("content-type", "")
        if ctype.startswith("text/plain"):
            message = body[:1000].decode("utf-8", "replace")
        else:
            message = f"{len(body)}-byte {ctype or 'untyped'} body"
    parts = [f"provider answered HTTP {status} ({kind})"]
    if message:
        parts.append(_one_line(message))
    retry_after = parse_retry_after(h, status=status, now=now)
    if retry_after is not None and kind in ("rate_limit", "server_error"):
        parts.append(f"retry after {retry_after:g}s")
    text = ": ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:]) + f"; {hint}"
    return ProviderError(
        text, kind=kind, status=status, retry_after=retry_after,
        provider_code=code[:100] if code else None,
        fault=ProviderFault("redirect" if 300 <= status < 400 else "status", status=status, code=code),
    )


def _hooked(hook: ErrorHook | None, status: int, body: bytes) -> Mapping[str, str] | None:
    if hook is None:
        return None
    try:
        return hook(status, body)
    except Exception as e:  # noqa: BLE001 - a failing hook never hides the provider's answer
        log.info("the adapter's transform_error failed (%s); reading the error body as usual", type(e).__name__)
        return None


# ======================================================================================
# Retries
# ======================================================================================

_NEVER_RETRY_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def is_retryable(error: ProviderError) -> bool:
    """429, 5xx, and transport failures (status None) that are not configuration errors."""
    if error.provider_code in _NEVER_RETRY_CODES:
        return False
    status = error.status
    if status is None:
        return error.kind in ("server_error", "timeout")
    return status == 429 or status >= 500


@dataclass(frozen=True)
class RetryPolicy:
    """Decides whether and when to retry; see the module docstring for the rules."""

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.2
    retry_after_ceiling: float | None = None
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay_for(self, attempt: int, error: ProviderError) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` after ``error`` ended attempt
        ``attempt`` (1-based); None means give up and raise ``error``."""
        if attempt > self.max_retries or not is_retryable(error):
            return None
        if error.retry_after is not None:
            ceiling = self.max_delay if self.retry_after_ceiling is None else self.retry_after_ceiling
            return error.retry_after if error.retry_after <= ceiling else None
        return backoff_delay(
            attempt, base=self.base_delay, cap=self.max_delay, spread=(1.0 - self.jitter, 1.0), rng=self.rng
        )


# ======================================================================================
# I/O shell
# ======================================================================================


@dataclass
class TransportTiming:
    """Per-call measurements for the turn timing log (seconds, monotonic clock)."""

    attempts: int = 0
    status: int | None = None
    ttfb: float | None = None
    total: float | None = None
    retry_wait: float = 0.0
    bytes_received: int = 0


def _host(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2] or url


def host_port(url: str) -> str:
    """``host:port`` of ``url`` (the scheme's port when none is given; no user info):
    where a request went, for messages and log lines."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or _host(url)
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    port = port or {"https": 443, "http": 80}.get(parts.scheme)
    return f"{host}:{port}" if port else host


def connect_fault(exc: BaseException) -> ProviderFault:
    """What kept a connection from opening, read from the exception chain httpx raises
    (``httpx.ConnectError`` ← ``httpcore`` ← ``OSError``): refused, DNS, TLS (with
    OpenSSL's reason, e.g. ``CERTIFICATE_VERIFY_FAILED``), a connect timeout, or
    another network failure (with its errno name)."""
    import errno
    import socket
    import ssl

    if isinstance(exc, httpx.ConnectTimeout):
        return ProviderFault("connect_timeout")
    seen: set[int] = set()
    cause: BaseException | None = exc
    other: str | None = None
    while cause is not None and id(cause) not in seen and len(seen) < 16:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            return ProviderFault("tls", detail="CERTIFICATE_VERIFY_FAILED")
        if isinstance(cause, ssl.SSLError):
            reason = cause.reason if isinstance(cause.reason, str) else None
            return ProviderFault("tls", detail=reason)
        if isinstance(cause, socket.gaierror):
            return ProviderFault("dns")
        if isinstance(cause, ConnectionRefusedError):
            return ProviderFault("refused")
        if isinstance(cause, OSError) and isinstance(cause.errno, int) and other is None:
            other = errno.errorcode.get(cause.errno)
        cause = cause.__cause__ or cause.__context__
    text = str(exc)
    if "SSL" in text or "TLS" in text or "certificate" in text:
        return ProviderFault("tls")
    return ProviderFault("unreachable", detail=other)


def _map_httpx_error(exc: httpx.HTTPError, url: str, *, received: int | None) -> ProviderError:
    """httpx failure → ProviderError. ``received`` is the body bytes already read, or
    None when no 2xx body had started (then the error is retryable)."""
    host = _host(url)
    detail = _one_line(str(exc) or type(exc).__name__, 200)
    if received is not None:
        if isinstance(exc, httpx.ReadTimeout):
            return ProviderError(
                f"stream stalled: no data from {host} for the read timeout after {received} bytes; "
                "try again or raise read_timeout", kind="timeout", fault=ProviderFault("read_timeout"))
        return ProviderError(
            f"stream ended early: the connection to {host} was cut after {received} bytes "
            f"({detail}); try again", kind="server_error", fault=ProviderFault("cut"))
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ProviderError(f"cannot reach {host}: {detail}; check base_url and the network",
                             kind="server_error", fault=connect_fault(exc))
    if isinstance(exc, httpx.ReadTimeout):
        return ProviderError(f"{host} did not answer within the read timeout; try again or "
                             "raise read_timeout", kind="timeout", fault=ProviderFault("read_timeout"))
    if isinstance(exc, httpx.TimeoutException):  # write / pool
        return ProviderError(f"timed out talking to {host} ({type(exc).__name__}); try again",
                             kind="timeout", fault=ProviderFault("timeout"))
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return ProviderError(f"bad provider URL for {host}: {detail}; fix base_url",
                             kind="invalid_request", fault=ProviderFault("bad_url"))
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return ProviderError(f"connection to {host} failed: {detail}; try again", kind="server_error",
                             fault=ProviderFault("cut"))
    return ProviderError(f"connection to {host} failed: {detail}; try again", kind="server_error",
                         fault=connect_fault(exc))


def _located(err: ProviderError, provider: str, url: str) -> ProviderError:
    """``err`` with its fault naming the provider and ``host:port`` (one place for both
    request shells); an error built without a fault is a body the host could not read."""
    fault = err.fault or ProviderFault("not_json", status=err.status)
    err.fault = fault.at(host=host_port(url), provider=provider)
    return err


async def _read_bounded(resp: httpx.Response, limit: int) -> bytes:
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        buf += chunk
        if len(buf) >= limit:
            del buf[limit:]
            break
    return bytes(buf)


def _give_up(err: ProviderError, attempts: int) -> ProviderError:
    if attempts <= 1:
        return err
    new = ProviderError(f"{err} (gave up after {attempts} attempts)", kind=err.kind,
                        status=err.status, retry_after=err.retry_after,
                        provider_code=err.provider_code,
                        fault=replace(err.fault, attempts=attempts) if err.fault is not None else None)
    return new


class ProviderTransport:
    """One pooled ``httpx.AsyncClient`` for one provider; reuse it for every call."""

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        write_timeout: float | None = None,
        pool_timeout: float | None = None,
        deadline: float | None = None,
        retry: RetryPolicy | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_error_body_bytes: int = DEFAULT_MAX_ERROR_BODY_BYTES,
        max_connections: int = 1024,
        http_transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: a TLS context to share (building one costs about 0.1 s: many short-lived
        transports pass one, ``httpx.create_ssl_context()``); None: httpx's default."""
        self.name = name
        self.base_url = base_url
        self.read_timeout = read_timeout
        self.deadline = deadline
        self.retry = retry or RetryPolicy()
        self.max_response_bytes = max_response_bytes
        self.max_line_bytes = max_line_bytes
        self.max_error_body_bytes = max_error_body_bytes
        self._sleep = sleep
        timeout = httpx.Timeout(
            connect=connect_timeout,
            read=read_timeout,
            # Request bodies with images can be large: give writes the read budget.
            write=read_timeout if write_timeout is None else write_timeout,
            pool=connect_timeout if pool_timeout is None else pool_timeout,
        )
        self.client = httpx.AsyncClient(
            headers={"Content-Type": "application/json", **dict(headers or {})},
            timeout=timeout,
            # a stream holds its connection for its whole length: the pool must hold
            # every stream in flight (httpx's default of 100 would queue the 101st)
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=min(max_connections, 64), keepalive_expiry=30.0),
            follow_redirects=False,
            transport=http_transport,
            verify=tls if tls is not None else True,
            # no cookie is kept: a client serves every account of its configuration
            # (gelbridge._runtime.shared), and a provider's cookie from one account's
            # answer would go out with the next account's request
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        )

    def url(self, endpoint: str, *, model: str | None = None,
            query: Mapping[str, str] | None = None) -> str:
        """``join_url`` against this provider's base_url."""
        return join_url(self.base_url, endpoint, model=model, query=query)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> ProviderTransport:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- helpers shared by post_json and stream --------------------------------------

    async def _wait_or_give_up(self, attempt: int, err: ProviderError, timing: TransportTiming,
                               deadline_at: float | None, url: str) -> None:
        """Sleep before the next attempt, or raise ``err`` when the policy says stop."""
        delay = self.retry.delay_for(attempt, err)
        if delay is not None and deadline_at is not None:
            if time.monotonic() + delay >= deadline_at:
                delay = None
        if delay is None:
            raise _give_up(err, attempt)
        log.info("retrying %s (%s) after %s in %.2fs (attempt %d of %d)", self.name,
                 _host(url), err.status or err.kind, delay, attempt + 1, self.retry.max_retries + 1)
        timing.retry_wait += delay
        await self._sleep(delay)

    def _deadline_at(self, deadline: float | None) -> float | None:
        d = self.deadline if deadline is None else deadline
        return None if d is None else time.monotonic() + d

    # -- non-stream -------------------------------------------------------------------

    async def post_json(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        deadline: float | None = None,
        timing: TransportTiming | None = None,
        error_hook: ErrorHook | None = None,
    ) -> bytes:
        """POST ``body``; return the JSON body of a 2xx answer, else raise ProviderError
        (``error_hook``: the adapter's reading of an error answer)."""
        return await self._json("POST", url, body, headers, deadline, timing, error_hook)

    async def get_json(self, url: str, headers: Mapping[str, str] | None = None, *,
                       deadline: float | None = None) -> bytes:
        """GET ``url``; return the JSON body of a 2xx answer, else raise ProviderError
        (the same rules as ``post_json``: retries, deadline, size bound, error mapping)."""
        return await self._json("GET", url, None, headers, deadline, None, None)

    async def _json(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None,
                    deadline: float | None, timing: TransportTiming | None, error_hook: ErrorHook | None) -> bytes:
        timing = timing if timing is not None else TransportTiming()
        start = time.monotonic()
        deadline_at = self._deadline_at(deadline)
        try:
            if deadline_at is None:
                return await self._send_json(method, url, body, headers, timing, start, None, error_hook)
            try:
                async with asyncio.timeout_at(_loop_time_at(deadline_at)):
                    return await self._send_json(method, url, body, headers, timing, start, deadline_at,
                                                 error_hook)
            except TimeoutError:
                raise ProviderError(
                    f"{_host(url)} did not finish within the {deadline_at - start:g}s deadline; "
                    "try again or raise the deadline", kind="timeout",
                    fault=ProviderFault("deadline", host=host_port(url), provider=self.name)) from None
        finally:
            timing.total = time.monotonic() - start

    async def _send_json(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None,
                         timing: TransportTiming, start: float,
                         deadline_at: float | None, error_hook: ErrorHook | None = None) -> bytes:
        attempt = 0
        while True:
            attempt += 1
            timing.attempts = attempt
            try:
                async with self.client.stream(method, url, content=body, headers=headers) as resp:
                    timing.status = resp.status_code
                    if not 200 <= resp.status_code < 300:
                        raw = await _read_bounded(resp, self.max_error_body_bytes)
                        raise error_from_response(resp.status_code, raw, resp.headers, hook=error_hook)
                    buf = bytearray()
                    async for chunk in resp.aiter_bytes():
                        if timing.ttfb is None:
                            timing.ttfb = time.monotonic() - start
                        buf += chunk
                        timing.bytes_received = len(buf)
                        if len(buf) > self.max_response_bytes:
                            raise ProviderError(
                                f"response from {_host(url)} is larger than "
                                f"{self.max_response_bytes} bytes; refusing it",
                                kind="server_error", status=resp.status_code, fault=ProviderFault("too_large"))
                    data = bytes(buf)
                    _require_json(data, resp, url)
                    return data
            except ProviderError as e:
                err = _located(e, self.name, url)
            except httpx.HTTPError as e:
                err = _located(_map_httpx_error(e, url, received=None), self.name, url)
            await self._wait_or_give_up(attempt, err, timing, deadline_at, url)

    # -- stream -----------------------------------------------------------------------

    def stream(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        framing: Framing = "sse",
        *,
        deadline: float | None = None,
        error_hook: ErrorHook | None = None,
    ) -> ProviderStream:
        """Start a streaming POST; iterate the result for payloads (see ProviderStream)."""
        if framing not in ("sse", "ndjson"):
            raise ValueError(f"framing must be 'sse' or 'ndjson', not {framing!r}")
        return ProviderStream(self, url, body, headers, framing, self._deadline_at(deadline), error_hook)


def _loop_time_at(monotonic_at: float) -> float:
    """A ``time.monotonic`` instant on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())


def _require_json(data: bytes, resp: httpx.Response, url: str) -> None:
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError):
        ctype = resp.headers.get("content-type", "no content-type")
        raise ProviderError(
            f"{_host(url)} answered HTTP {resp.status_code} with a body that is not JSON "
            f"({len(data)} bytes, {_one_line(ctype, 80)}); check that base_url points at the API",
            kind="server_error", status=resp.status_code,
            fault=ProviderFault("not_json", status=resp.status_code)) from None


def _json_instead_of_stream(status: int, raw: bytes, url: str) -> ProviderError:
    """A 2xx JSON body where an event stream was asked for: an error some gateways send
    with status 200, or a server that ignored the stream flag. Either way the SSE
    decoder would find no events and the turn would end silently empty."""
    message, code, flagged = _provider_fields(raw)
    said = f": {_one_line(message)}" if message else ""
    return ProviderError(
        f"{_host(url)} answered HTTP {status} with JSON instead of an event stream{said}; "
        "check that the adapter asks for streaming and the model supports it",
        kind="content_filter" if flagged else "server_error", status=status,
        provider_code=code[:100] if code else None,
        fault=ProviderFault("not_a_stream", status=status, code=code))


_DRAIN_BYTES = 64 * 1024
_DRAIN_SECONDS = 0.25


class ProviderStream:
    """Async iterator of a streaming answer's payloads.

    ``saw_done``: a ``[DONE]`` ended the stream. ``ended_cleanly``: the body ended
    without a transport error (with or without ``[DONE]``). ``timing``: measurements.
    """

    def __init__(self, transport: ProviderTransport, url: str, body: bytes,
                 headers: Mapping[str, str] | None, framing: Framing,
                 deadline_at: float | None, error_hook: ErrorHook | None = None) -> None:
        self._t = transport
        self._error_hook = error_hook
        self._url = url
        self._body = body
        self._headers = headers
        self._framing = framing
        self._deadline_at = deadline_at
        self._gen: AsyncIterator[str] | None = None
        self._start = time.monotonic()
        self._in_body = False  # a 2xx body is arriving (from then on _run checks the deadline per chunk)
        self.timing = TransportTiming()
        self.saw_done = False
        self.ended_cleanly = False

    def __aiter__(self) -> ProviderStream:
        return self

    async def __anext__(self) -> str:
        if self._gen is None:
            self._start = time.monotonic()
            self._gen = self._run()
        deadline = self._deadline_at
        # A timer per chunk costs more than the chunk's adapter work: once the body flows,
        # _run checks the deadline at every chunk (a trickle of keep-alives included) and
        # the read timeout ends a silent stall, so the timer is armed only before the
        # body and when less than a read timeout is left.
        if deadline is None or (self._in_body and deadline - time.monotonic() > self._t.read_timeout):
            return await self._gen.__anext__()
        try:
            async with asyncio.timeout_at(_loop_time_at(deadline)):
                return await self._gen.__anext__()
        except TimeoutError:
            raise self._past_deadline() from None

    def _past_deadline(self) -> ProviderError:
        self.timing.total = time.monotonic() - self._start
        return ProviderError(f"stream from {_host(self._url)} did not finish within its deadline; "
                             "try again or raise the deadline", kind="timeout",
                             fault=ProviderFault("deadline", host=host_port(self._url), provider=self._t.name))

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> ProviderStream:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _run(self) -> AsyncIterator[str]:
        t, timing, url = self._t, self.timing, self._url
        attempt = 0
        try:
            while True:
                attempt += 1
                timing.attempts = attempt
                received: int | None = None  # None until a 2xx body byte arrives
                try:
                    async with t.client.stream("POST", url, content=self._body,
                                               headers=self._headers) as resp:
                        timing.status = resp.status_code
                        if not 200 <= resp.status_code < 300:
                            raw = await _read_bounded(resp, t.max_error_body_bytes)
                            raise error_from_response(resp.status_code, raw, resp.headers,
                                                      hook=self._error_hook)
                        limit = t.max_response_bytes
                        ctype = resp.headers.get("content-type", "")
                        framing = self._framing
                        if framing == "sse" and ctype.startswith(NDJSON_TYPES):
                            # an ADAPTER.md script knows only SSE: an NDJSON stream's lines
                            # are handed to it as SSE data payloads are (Ollama's native API)
                            framing = "ndjson"
                        if framing == "sse" and ctype.startswith("application/json"):
                            raw = await _read_bounded(resp, t.max_error_body_bytes)
                            raise _json_instead_of_stream(resp.status_code, raw, url)
                        if framing == "sse":
                            sse = SSEDecoder(max_line_chars=t.max_line_bytes)
                            feed: Callable[[bytes], list[Any]] = sse.feed
                            close: Callable[[], list[Any]] = sse.close
                        else:
                            nd = NDJSONDecoder(max_line_bytes=t.max_line_bytes)
                            feed, close = nd.feed, nd.close
                        is_sse = framing == "sse"
                        chunks = resp.aiter_bytes()
                        n = 0
                        deadline = self._deadline_at
                        async for chunk in chunks:
                            if received is None:
                                received = 0
                                timing.ttfb = time.monotonic() - self._start
                                self._in_body = True
                            if deadline is not None and time.monotonic() > deadline:
                                raise self._past_deadline()
                            n += len(chunk)
                            received = n
                            if n > limit:
                                raise ProviderError(
                                    f"stream from {_host(url)} is larger than {limit} bytes; "
                                    "stopping it", kind="server_error", status=resp.status_code,
                                    fault=ProviderFault("too_large"))
                            for item in feed(chunk):
                                payload = item.data if is_sse else item
                                if not payload:
                                    continue  # empty data: keep-alive
                                if is_sse and payload == "[DONE]":
                                    self.saw_done = True
                                    timing.bytes_received = n
                                    await _drain(chunks)
                                    self.ended_cleanly = True
                                    return
                                yield payload
                            timing.bytes_received = n
                        if received is None:
                            received = 0  # an empty 2xx body ended cleanly
                        for item in close():
                            payload = item.data if is_sse else item
                            if is_sse and payload == "[DONE]":
                                self.saw_done = True
                                break
                            if payload:
                                yield payload
                        self.ended_cleanly = True
                        return
                except ProviderError as e:
                    err = _located(e, t.name, url)
                except httpx.HTTPError as e:
                    err = _located(_map_httpx_error(e, url, received=received), t.name, url)
                if received is not None:
                    raise err
                await t._wait_or_give_up(attempt, err, timing, self._deadline_at, url)
        finally:
            timing.total = time.monotonic() - self._start


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (bounded) so the connection can be reused."""
    seen = 0
    try:
        async with asyncio.timeout(_DRAIN_SECONDS):
            async for chunk in chunks:
                seen += len(chunk)
                if seen > _DRAIN_BYTES:
                    return
    except (TimeoutError, httpx.HTTPError):
        return


# ======================================================================================
# Pool
# ======================================================================================


class TransportPool:
    """One ``ProviderTransport`` per provider name, created on first use, closed together."""

    def __init__(
        self,
        providers: Mapping[str, ProviderConfig],
        *,
        env: Mapping[str, str] | None = None,
        retry: Callable[[ProviderConfig], RetryPolicy] | None = None,
        http_transport: Callable[[str], httpx.AsyncBaseTransport | None] | None = None,
    ) -> None:
        self._providers = dict(providers)
        self._env = env
        self._retry = retry
        self._http_transport = http_transport
        self._transports: dict[str, ProviderTransport] = {}
        self._closed = False

    def get(self, name: str) -> ProviderTransport:
        """The transport for provider ``name``; reads its API key from the environment
        the first time."""
        if self._closed:
            raise RuntimeError("TransportPool is closed")
        tr = self._transports.get(name)
        if tr is not None:
            return tr
        cfg = self._providers.get(name)
        if cfg is None:
            known = ", ".join(sorted(self._providers)) or "none"
            raise ConfigError(f"unknown provider {name!r} (configured: {known}); "
                              "add it under [providers] in the config file")
        env = os.environ if self._env is None else self._env
        key: str | None = None
        if cfg.api_key_env:
            key = env.get(cfg.api_key_env)
            if not key:
                raise ConfigError(f"provider {name!r}: environment variable {cfg.api_key_env} "
                                  "is not set; export the API key in it")
        headers = {**auth_headers(default_auth_style(cfg.adapter), key), **cfg.headers}
        policy = self._retry(cfg) if self._retry else RetryPolicy(max_retries=cfg.max_retries)
        tr = ProviderTransport(
            name, cfg.base_url, headers=headers, connect_timeout=cfg.connect_timeout,
            read_timeout=cfg.read_timeout, deadline=cfg.deadline, retry=policy,
            max_connections=cfg.max_connections,
            http_transport=self._http_transport(name) if self._http_transport else None,
        )
        self._transports[name] = tr
        return tr

    async def aclose(self) -> None:
        self._closed = True
        transports, self._transports = list(self._transports.values()), {}
        await asyncio.gather(*(t.aclose() for t in transports), return_exceptions=True)

    async def __aenter__(self) -> TransportPool:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
