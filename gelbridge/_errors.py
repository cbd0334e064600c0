"""The gelbridge error hierarchy.

Every error message says what went wrong and, where it can, what to do next. No
message ever contains plaintext content or key material: records are named by their
AT-URI or record key, keys by their keyId.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Final


class GelbridgeError(Exception):
    """Base of every error gelbridge raises on purpose.

    ``kind`` is the machine-readable name written into a reply's ``error.kind`` when
    the error ends a turn (PROTOCOL.md §1: Lux IR error kinds plus decrypt_failed,
    bad_record, adapter_error, tool_error, timeout, interrupted).
    """

    kind: str = "bad_record"
    #: a model call that failed after its stream began: the ``LuxResponse`` so far
    #: (finish reason ``error``), and the diagnostics of the way (``ModelClient``)
    partial: Any = None
    diagnostics: list[Any] = []  # replaced per instance, never appended to

    def __init__(self, *args: object, kind: str | None = None) -> None:
        """``kind``: this error's reply kind where its class's does not fit (chosen where the
        error is raised, never set on it afterwards)."""
        super().__init__(*args)
        if kind is not None:
            self.kind = kind


#: ``error.kind`` values a reply may carry (PROTOCOL.md §1): the Lux IR error kinds
#: (``lux.ErrorKind``, spelled out: lux imports this module; tests/test_errors.py checks
#: that each is here) plus gelbridge's own.
REPLY_ERROR_KINDS: Final[frozenset[str]] = frozenset({
    "rate_limit", "invalid_request", "authentication", "server_error", "content_filter",
    "decrypt_failed", "bad_record", "adapter_error", "tool_error", "timeout", "interrupted"})


class ConfigError(GelbridgeError):
    """The configuration file or environment is wrong."""

    kind = "invalid_request"


# --- records and sealing ---------------------------------------------------------


class RecordError(GelbridgeError):
    """A record is malformed, too large, or does not follow the lexicon."""

    kind = "bad_record"


class SealingError(GelbridgeError):
    """Sealed content could not be opened or sealed."""

    kind = "decrypt_failed"


class UnknownSchemeError(SealingError):
    """The record uses an encryption scheme gelbridge does not know."""


class UnknownKeyError(SealingError):
    """The record names a keyId that is not in the keyring."""


class DecryptError(SealingError):
    """Authentication failed: the key is wrong or the ciphertext was tampered with."""


class MovedCiphertextError(SealingError):
    """The ciphertext authenticates, but for another record: it was copied here."""


class MalformedSealError(SealingError):
    """A sealed field has the wrong shape (nonce length, truncated ciphertext)."""


class KeyringError(GelbridgeError):
    """The keyring file or environment variable is missing or malformed."""

    kind = "invalid_request"


class PairingError(GelbridgeError):
    """An app cannot grant a key to the bridge: none is published, several are and none
    was chosen, or the published key is not the one pinned (PROTOCOL.md §6)."""

    kind = "invalid_request"


class OAuthError(GelbridgeError):
    """An atproto OAuth step failed: the authorization server refused, or what it granted
    is not what gelbridge asked for (a missing scope, another account). ``error`` is the
    server's OAuth error code when it gave one."""

    kind = "invalid_request"

    def __init__(self, message: str, *, error: str | None = None) -> None:
        super().__init__(message)
        self.error = error


#: the environment variable that names the keyring file (here, next to its error, so the
#: CLI's ``--keyring`` options are declared without importing the crypto and record models)
KEYRING_ENV: Final = "GELBRIDGE_KEYRING"


# --- threads ------------------------------------------------------------------------


class ThreadError(GelbridgeError):
    """The parent chain of a message cannot be walked: ``rkey`` is the record where the
    walk stopped, ``referenced_by`` the record whose ``parent`` named it (record keys only)."""

    kind = "bad_record"
    rkey: str | None = None
    referenced_by: str | None = None


class MissingRecordError(ThreadError):
    """A record named by a ``parent`` link does not exist."""


class ThreadCycleError(ThreadError):
    """``parent`` links form a loop."""


class ForeignConversationError(ThreadError):
    """A ``parent`` link leads into another conversation."""


class ThreadTooDeepError(ThreadError):
    """The thread is longer than the configured limit."""


class RequestTooLargeError(GelbridgeError):
    """The model request a thread makes is larger than ``[thread] max_request_bytes``
    (its message names sizes and the setting only)."""

    kind = "invalid_request"

    @classmethod
    def of(cls, limit: int, what: str = "its request to the model would be") -> RequestTooLargeError:
        """The message names the bound only: the request's own size is derived from sealed
        content, and this message is written unsealed."""
        return cls(f"this conversation is too large to send to the model: {what} larger than the "
                   f"{_mb(limit)} this gelbridge sends ([thread] max_request_bytes); start a new "
                   "conversation, or send fewer or smaller files")


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


# --- adapters, transport, providers -------------------------------------------------


class AdapterError(GelbridgeError):
    """A Lua adapter failed to load or to transform data."""

    kind = "adapter_error"


class AdapterLoadError(AdapterError):
    """An adapter script could not be loaded (syntax error, bad contract)."""


class SandboxViolation(AdapterError):
    """An adapter script exceeded a sandbox limit (CPU, wall clock, memory)."""

    adapter: str | None = None
    """The adapter's name."""
    limit: str | None = None
    """Which limit: time, instructions, memory, pattern or string_size."""


#: What went wrong with a provider call (``ProviderFault.what``): a fixed vocabulary.
FAULTS: dict[str, str] = {
    "refused": "connection refused at {host}",
    "dns": "the host name of {host} does not resolve (DNS)",
    "tls": "TLS with {host} failed",
    "connect_timeout": "no connection to {host} within the connect timeout",
    "unreachable": "cannot connect to {host}",
    "read_timeout": "{host} did not answer within the read timeout",
    "timeout": "timed out talking to {host}",
    "deadline": "{host} did not finish within the call's deadline",
    "cut": "the connection to {host} was cut mid-answer",
    "status": "HTTP {status} from {host}",
    "redirect": "HTTP {status} (a redirect) from {host}",
    "not_json": "{host} answered HTTP {status} with a body that is not JSON",
    "too_large": "the answer from {host} is larger than gelbridge accepts",
    "not_a_stream": "{host} answered HTTP {status} with JSON where an event stream was asked for",
    "bad_stream": "the stream from {host} is not well formed",
    "error_reply": "{host} reported an error in its answer",
    "error_event": "{host} sent an error event mid-stream",
    "no_events": "the stream from {host} ended without any event the adapter understood",
    "bad_url": "the request URL for {host} is not valid",
}

#: Provider error codes and types worth a log line: each provider's documented,
#: fixed vocabulary (OpenAI ``code``/``type``, Anthropic ``error.type``, Google
#: ``status``, the Lux kinds). A code outside it is never logged: a provider (or a
#: proxy) may put anything in the field, even an echo of the request.
PROVIDER_CODES: frozenset[str] = frozenset({
    # OpenAI (and the OpenAI-compatible hosts: DeepSeek, OpenRouter, Groq, Mistral...)
    "invalid_api_key", "invalid_request_error", "authentication_error", "permission_error",
    "not_found_error", "model_not_found", "insufficient_quota", "billing_hard_limit_reached",
    "rate_limit_exceeded", "rate_limit_error", "context_length_exceeded", "server_error",
    "invalid_encrypted_content", "unsupported_country_region_territory", "content_policy_violation",
    "content_filter", "moderation_blocked", "invalid_organization", "invalid_project",
    "account_deactivated", "insufficient_permissions", "unsupported_parameter", "unsupported_value",
    "unknown_parameter", "invalid_value", "invalid_type", "missing_required_parameter",
    "string_above_max_length", "tokens", "requests", "engine_overloaded",
    # Anthropic
    "billing_error", "request_too_large", "api_error", "overloaded_error", "timeout_error",
    # Google (Gemini)
    "INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNAUTHENTICATED", "PERMISSION_DENIED",
    "NOT_FOUND", "ABORTED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "CANCELLED", "DATA_LOSS", "UNKNOWN",
    "INTERNAL", "NOT_IMPLEMENTED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
    # Azure OpenAI
    "ResponsibleAIPolicyViolation", "DeploymentNotFound",
    # the Lux IR kinds (a script's error event)
    "rate_limit", "invalid_request", "authentication", "timeout",
})

_HTTP_CODE = re.compile(r"[1-5][0-9][0-9]")  # OpenRouter's numeric error.code
_DETAIL = re.compile(r"[A-Z][A-Z0-9_]{0,63}")  # an OpenSSL reason, an errno name


def known_code(code: object) -> str | None:
    """``code`` when it belongs to a provider's fixed vocabulary (``PROVIDER_CODES``, or
    an HTTP status number), else None."""
    if isinstance(code, int) and not isinstance(code, bool):
        code = str(code)
    if not isinstance(code, str):
        return None
    return code if code in PROVIDER_CODES or _HTTP_CODE.fullmatch(code) else None


@dataclass(frozen=True)
class ProviderFault:
    """Why a provider call failed, in words safe for any log line: ``what`` (a key of
    ``FAULTS``), the provider (its ``[providers]`` name), ``host:port`` (from base_url),
    the HTTP status, the provider's error code when it is in ``PROVIDER_CODES``, the
    local cause's fixed name (an OpenSSL reason such as ``CERTIFICATE_VERIFY_FAILED``)
    and the attempts made. Never a body, a header or anything from the request."""

    what: str
    host: str | None = None
    status: int | None = None
    code: str | None = None
    detail: str | None = None
    provider: str | None = None
    attempts: int = 1

    def __post_init__(self) -> None:
        if self.what not in FAULTS:
            raise ValueError(f"unknown provider fault {self.what!r}")
        if self.code is not None and (known_code(self.code) != self.code or self.code == str(self.status)):
            object.__setattr__(self, "code", None)  # unknown, or the status again (OpenRouter's code)
        if self.detail is not None and not _DETAIL.fullmatch(self.detail):
            object.__setattr__(self, "detail", None)

    def at(self, *, host: str | None = None, provider: str | None = None) -> ProviderFault:
        """This fault with the host and provider filled in where it had none."""
        return replace(self, host=self.host or host, provider=self.provider or provider)

    def __str__(self) -> str:
        text = FAULTS[self.what].format(host=self.host or "the provider", status=self.status or "?")
        extra = [x for x in (self.code, self.detail) if x]
        if extra:
            text += f" ({', '.join(extra)})"
        if self.provider:
            text = f"provider {self.provider!r}: {text}"
        if self.attempts > 1:
            text += f", after {self.attempts} attempts"
        return text


class ProviderError(GelbridgeError):
    """The model provider answered with an error, or could not be reached.

    ``kind`` is one of the Lux IR error kinds (rate_limit, invalid_request,
    authentication, server_error, content_filter) or ``timeout``. The message may
    quote the provider's own words (which can echo the request): it never goes into
    a log or a reply. ``fault`` says what happened in words that may (``ProviderFault``).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "server_error",
        status: int | None = None,
        retry_after: float | None = None,
        provider_code: str | None = None,
        fault: ProviderFault | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after
        self.provider_code = provider_code
        self.fault = fault


# --- PDS, tools, worker --------------------------------------------------------------


class PdsError(GelbridgeError):
    """The PDS refused a request or could not be reached.

    ``status`` is the HTTP status (None when no answer came), ``error`` the XRPC error
    name (e.g. ``InvalidSwap``, ``RecordNotFound``) when the PDS gave one.
    """

    kind = "server_error"

    def __init__(self, message: str, *, status: int | None = None, error: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error


class ClaimConflict(PdsError):
    """A create-only write found the record already there with other content."""


class PdsUnavailable(PdsError):
    """The PDS could not be reached, dropped the connection, or answered 5xx.

    Usually transient: retry later with backoff.
    """


class PdsRateLimited(PdsError):
    """The PDS answered 429. ``retry_after`` is how many seconds to wait (if known)."""

    kind = "rate_limit"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = 429,
        error: str | None = "RateLimitExceeded",
    ) -> None:
        super().__init__(message, status=status, error=error)
        self.retry_after = retry_after


class PdsAuthError(PdsError):
    """The PDS refused the credentials or the session (log in again)."""

    kind = "authentication"


class FirehoseError(PdsError):
    """The firehose sent an error frame (e.g. FutureCursor) or an undecodable frame."""


class ToolError(GelbridgeError):
    """A tool failed, timed out, or is unknown."""

    kind = "tool_error"


class ToolJournalConflict(ToolError):
    """A tool-call id was reused for another account, tool or input: the journal
    cannot tell which call it is, so the call is not run."""


class StateError(GelbridgeError):
    """The state database cannot be opened, is from a newer gelbridge, or is corrupt."""

    kind = "server_error"


class LeaseLost(GelbridgeError):
    """This worker no longer holds (or soon may not hold) the fleet's lease on the account:
    it must not write for it again; the worker that takes the lease over finishes the work."""

    kind = "lease_lost"


def is_transient(error: BaseException) -> bool:
    """A failure that may pass by itself (the PDS or the state store unreachable, a
    socket error): an event source retries the record instead of skipping it. A
    ``ClaimConflict`` is an answer, not an outage."""
    return isinstance(error, (PdsError, StateError, OSError)) and not isinstance(error, ClaimConflict)


def failure_of(error: BaseException) -> str:
    """An error for a log line, without its message: its type, and for a provider
    failure what happened (``ProviderFault``: ``ProviderError: provider 'openai':
    connection refused at 127.0.0.1:9``)."""
    fault = error.fault if isinstance(error, ProviderError) else None
    return f"{type(error).__name__}: {fault}" if fault is not None else type(error).__name__


def where_it_failed(error: BaseException) -> str:
    """An unexpected error for a log line: its type and the code locations it passed
    through, never its message (which may quote sealed content, e.g. ``KeyError('…')``)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)[-8:]
    trail = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(error).__name__} at {trail}" if trail else type(error).__name__


def is_refused_write(error: BaseException) -> bool:
    """A record write that is refused however often it is tried: gelbridge's own record
    or sealing checks, or the PDS answering 400 (not a valid record) or 413 (too large).
    Outages, rate limits, expired sessions and swap conflicts are not refusals."""
    if isinstance(error, (RecordError, SealingError)):
        return True
    return type(error) is PdsError and error.status in (400, 413)
