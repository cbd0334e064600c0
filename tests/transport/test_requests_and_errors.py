"""URL joining, auth headers, provider error mapping, Retry-After and retry decisions."""

from __future__ import annotations

import email.utils
import json
import random

import pytest

from gelbridge._errors import ConfigError, ProviderError
from gelbridge._transport import (
    RetryPolicy,
    auth_headers,
    default_auth_style,
    error_from_response,
    is_retryable,
    join_url,
    parse_retry_after,
)

# --- join_url -------------------------------------------------------------------------

GEMINI = "https://generativelanguage.googleapis.com"


@pytest.mark.parametrize(
    ("base", "endpoint", "model", "query", "expected"),
    [
        ("https://api.openai.com/v1", "/chat/completions", None, None,
         "https://api.openai.com/v1/chat/completions"),
        ("https://api.openai.com/v1/", "/chat/completions", None, None,
         "https://api.openai.com/v1/chat/completions"),
        ("https://api.openai.com/v1", "chat/completions", None, None,
         "https://api.openai.com/v1/chat/completions"),
        ("https://api.groq.com/openai/v1", "/chat/completions", None, None,
         "https://api.groq.com/openai/v1/chat/completions"),
        ("https://api.anthropic.com", "/v1/messages", None, None,
         "https://api.anthropic.com/v1/messages"),
        ("http://127.0.0.1:11434", "/api/chat", None, None, "http://127.0.0.1:11434/api/chat"),
        ("http://127.0.0.1:11434/", "", None, None, "http://127.0.0.1:11434/"),
        (GEMINI, "/v1beta/models/{model}:generateContent", "gemini-2.0-flash", None,
         GEMINI + "/v1beta/models/gemini-2.0-flash:generateContent"),
        (GEMINI + "/", "/v1beta/models/{model}:streamGenerateContent?alt=sse", "gemini-2.0-flash",
         {"key": "k1"}, GEMINI + "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse&key=k1"),
        # a model id is one path segment: "/" and "?" cannot escape it
        ("https://h", "/m/{model}/x", "anthropic/claude-3.5", None, "https://h/m/anthropic%2Fclaude-3.5/x"),
        ("https://h", "/m/{model}", "a b?c#d", None, "https://h/m/a%20b%3Fc%23d"),
        ("https://h", "/m/{model}", "llama3:8b", None, "https://h/m/llama3:8b"),
        # Azure-style base query merged with endpoint and extra query; later wins
        ("https://x.openai.azure.com/openai/deployments/d?api-version=2024-02-01", "/chat/completions",
         None, {"api-version": "2024-06-01"},
         "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-06-01"),
        ("https://h/v1", "https://other.example/v2/chat?x=1", None, {"y": "2"},
         "https://other.example/v2/chat?x=1&y=2"),
    ],
)
def test_join_url(base: str, endpoint: str, model: str | None, query: dict | None, expected: str) -> None:
    assert join_url(base, endpoint, model=model, query=query) == expected


def test_join_url_needs_a_model_for_model_endpoints() -> None:
    with pytest.raises(ConfigError, match="needs a model"):
        join_url(GEMINI, "/v1beta/models/{model}:generateContent", model=None)
    with pytest.raises(ConfigError):
        join_url(GEMINI, "/v1beta/models/{model}:generateContent", model="..")


@pytest.mark.parametrize("base", ["api.openai.com/v1", "ftp://h/x", "https://"])
def test_join_url_rejects_bad_base_urls(base: str) -> None:
    with pytest.raises(ConfigError, match="base_url"):
        join_url(base, "/chat/completions")


# --- auth -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "style"),
    [("openai", "bearer"), ("deepseek", "bearer"), ("openai-compatible", "bearer"),
     ("anthropic", "x-api-key"), ("gemini", "x-goog-api-key"), ("ollama", "none"),
     ("something-new", "bearer")],
)
def test_default_auth_style(adapter: str, style: str) -> None:
    assert default_auth_style(adapter) == style


def test_auth_headers() -> None:
    assert auth_headers("bearer", "sk-1") == {"Authorization": "Bearer sk-1"}
    assert auth_headers("x-api-key", "a") == {"x-api-key": "a"}
    assert auth_headers("x-goog-api-key", "g") == {"x-goog-api-key": "g"}
    assert auth_headers("none", "ignored") == {}
    assert auth_headers("bearer", None) == {} and auth_headers("bearer", "") == {}


def test_auth_header_with_line_break_is_refused_without_echoing_the_key() -> None:
    with pytest.raises(ConfigError) as exc:
        auth_headers("bearer", "sk-secret\r\nX-Evil: 1")
    assert "sk-secret" not in str(exc.value)


# --- error mapping --------------------------------------------------------------------


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("status", "body", "kind", "code", "text"),
    [
        # OpenAI
        (401, _body({"error": {"message": "Incorrect API key provided: sk-abc***", "type": "invalid_request_error",
                               "param": None, "code": "invalid_api_key"}}),
         "authentication", "invalid_api_key", "Incorrect API key"),
        (429, _body({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}),
         "rate_limit", "rate_limit_exceeded", "Rate limit reached"),
        (400, _body({"error": {"message": "This model's maximum context length is 8192 tokens",
                               "type": "invalid_request_error", "code": "context_length_exceeded"}}),
         "invalid_request", "context_length_exceeded", "maximum context length"),
        (400, _body({"error": {"message": "Your request was rejected by the safety system",
                               "type": "invalid_request_error", "code": "content_policy_violation"}}),
         "content_filter", "content_policy_violation", "safety system"),
        (500, _body({"error": {"message": "The server had an error", "type": "server_error", "code": None}}),
         "server_error", "server_error", "server had an error"),
        # Anthropic
        (529, _body({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
         "server_error", "overloaded_error", "Overloaded"),
        (403, _body({"type": "error", "error": {"type": "permission_error", "message": "no access"}}),
         "authentication", "permission_error", "no access"),
        (413, _body({"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}),
         "invalid_request", "request_too_large", "maximum size"),
        # Gemini (and its list-wrapped stream form)
        (400, _body({"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}),
         "invalid_request", "INVALID_ARGUMENT", "API key not valid"),
        (429, _body([{"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}}]),
         "rate_limit", "RESOURCE_EXHAUSTED", "exhausted"),
        (503, _body({"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}),
         "server_error", "UNAVAILABLE", "overloaded"),
        # Ollama
        (404, _body({"error": "model 'llama9' not found, try pulling it first"}),
         "invalid_request", None, "not found"),
        # Azure content filter
        (400, _body({"error": {"message": "filtered", "code": "content_filter",
                               "innererror": {"code": "ResponsibleAIPolicyViolation"}}}),
         "content_filter", "content_filter", "filtered"),
        (422, b"", "invalid_request", None, "HTTP 422"),
    ],
)
def test_provider_error_bodies(status: int, body: bytes, kind: str, code: str | None, text: str) -> None:
    err = error_from_response(status, body, {"content-type": "application/json"})
    assert isinstance(err, ProviderError)
    assert (err.kind, err.status, err.provider_code) == (kind, status, code)
    assert text in str(err)
    assert "\n" not in str(err)


def test_openrouter_moderation_is_content_filter_and_never_echoes_flagged_input() -> None:
    body = _body({"error": {"code": 403, "message": "Your chosen model requires moderation",
                            "metadata": {"reasons": ["harassment"], "flagged_input": "SECRET USER TEXT",
                                         "provider_name": "x"}}})
    err = error_from_response(403, body, {})
    assert err.kind == "content_filter"
    assert "SECRET USER TEXT" not in str(err)


def test_long_messages_are_cut_to_one_short_line() -> None:
    err = error_from_response(400, _body({"error": {"message": "bad\n" + "x" * 5000}}), {})
    assert len(str(err)) < 500 and "\n" not in str(err)


def test_html_error_page_is_summarised_not_copied() -> None:
    err = error_from_response(502, b"<html><body>Bad Gateway " + b"y" * 500 + b"</body></html>",
                              {"Content-Type": "text/html"})
    assert err.kind == "server_error"
    assert "text/html" in str(err) and "<html>" not in str(err)


def test_redirect_says_to_check_base_url() -> None:
    err = error_from_response(301, b"", {"Location": "https://api.example/v1/chat"})
    assert err.kind == "invalid_request" and "base_url" in str(err)


def test_messages_say_what_to_do() -> None:
    assert "API key" in str(error_from_response(401, b"", {}))
    assert "model id" in str(error_from_response(404, b"", {}))


# --- Retry-After ----------------------------------------------------------------------


def test_retry_after_seconds_http_date_and_ms() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after({"Retry-After": "7"}, now=now) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}, now=now) == 1.5
    date = email.utils.formatdate(now + 20, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == pytest.approx(20.0)
    past = email.utils.formatdate(now - 100, usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}, now=now) == 0.25
    assert parse_retry_after({"Retry-After": "soon"}, now=now) is None
    assert parse_retry_after({}, now=now) is None


def test_openai_ratelimit_reset_headers_only_for_429() -> None:
    h = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "5",
         "x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "0"}
    assert parse_retry_after(h, status=429) == 360.0
    assert parse_retry_after({"x-ratelimit-reset-requests": "20ms"}, status=429) == pytest.approx(0.02)
    assert parse_retry_after(h, status=500) is None
    assert parse_retry_after({"x-ratelimit-reset-requests": "bogus"}, status=429) is None


def test_error_carries_retry_after() -> None:
    err = error_from_response(429, b"{}", {"Retry-After": "3"})
    assert err.retry_after == 3.0 and "retry after 3s" in str(err)


# --- RetryPolicy ----------------------------------------------------------------------


def _err(status: int | None, kind: str = "server_error", retry_after: float | None = None,
         code: str | None = None) -> ProviderError:
    return ProviderError("x", kind=kind, status=status, retry_after=retry_after, provider_code=code)


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 529])
def test_retries_429_and_5xx(status: int) -> None:
    assert RetryPolicy(jitter=0).delay_for(1, _err(status)) == 0.5


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 413, 422, 200])
def test_never_retries_other_statuses(status: int) -> None:
    assert RetryPolicy().delay_for(1, _err(status)) is None


def test_transport_failures_are_retried_but_config_errors_are_not() -> None:
    assert is_retryable(_err(None, "server_error"))
    assert is_retryable(_err(None, "timeout"))
    assert not is_retryable(_err(None, "invalid_request"))


def test_quota_exhaustion_is_not_retried() -> None:
    assert RetryPolicy().delay_for(1, _err(429, "rate_limit", code="insufficient_quota")) is None


def test_exponential_backoff_capped_and_bounded_attempts() -> None:
    p = RetryPolicy(max_retries=5, base_delay=1, max_delay=5, jitter=0)
    assert [p.delay_for(n, _err(503)) for n in range(1, 7)] == [1, 2, 4, 5, 5, None]


def test_jitter_only_shortens_within_its_fraction() -> None:
    p = RetryPolicy(base_delay=1, jitter=0.5, rng=random.Random(1))
    delays = [p.delay_for(1, _err(500)) for _ in range(200)]
    assert all(0.5 <= d <= 1.0 for d in delays) and len(set(delays)) > 100


def test_retry_after_is_honoured_up_to_the_ceiling() -> None:
    p = RetryPolicy(max_delay=30, jitter=0)
    assert p.delay_for(1, _err(429, "rate_limit", retry_after=12)) == 12
    assert p.delay_for(1, _err(429, "rate_limit", retry_after=31)) is None
    assert RetryPolicy(max_delay=30, retry_after_ceiling=120).delay_for(1, _err(503, retry_after=90)) == 90
    assert p.delay_for(4, _err(429, "rate_limit", retry_after=1)) is None
