"""Pure parts of the PDS client: error mapping, rate-limit waits, JWT expiry."""

from __future__ import annotations

import base64
import json

import httpx

from gelbridge._errors import ClaimConflict, PdsAuthError, PdsError, PdsRateLimited, PdsUnavailable
from gelbridge._pds import Session, error_from_response, jwt_expiry, retry_after_seconds


def resp(status: int, body: object = None, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def test_error_mapping() -> None:
    e = error_from_response(resp(400, {"error": "InvalidSwap", "message": "m"}), "putRecord x/y")
    assert isinstance(e, ClaimConflict) and e.error == "InvalidSwap" and e.status == 400
    assert isinstance(error_from_response(resp(502, {"error": "UpstreamFailure"}), "x"), PdsUnavailable)
    assert isinstance(error_from_response(resp(401, {"error": "AuthRequired"}), "x"), PdsAuthError)
    rl = error_from_response(resp(429, {"error": "RateLimitExceeded"}, {"retry-after": "7"}), "x")
    assert isinstance(rl, PdsRateLimited) and rl.retry_after == 7.0 and "7 s" in str(rl)
    other = error_from_response(resp(400, {"error": "InvalidRequest", "message": "bad rkey"}), "putRecord")
    assert type(other) is PdsError and "bad rkey" in str(other)
    assert "HTTP 400" in str(error_from_response(httpx.Response(400, text="<html>"), "x"))


def test_retry_after_sources() -> None:
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"ratelimit-reset": "1010"}, now=1000.0) == 10.0
    assert retry_after_seconds({"ratelimit-reset": "900"}, now=1000.0) == 0.0
    assert retry_after_seconds({}) is None


def test_jwt_expiry_reads_exp_and_tolerates_garbage() -> None:
    payload = base64.urlsafe_b64encode(json.dumps({"exp": 1234}).encode()).rstrip(b"=").decode()
    assert jwt_expiry(f"h.{payload}.s") == 1234.0
    assert jwt_expiry("not-a-jwt") is None
    assert jwt_expiry("a.!!!.c") is None


def test_session_repr_hides_tokens() -> None:
    s = Session("did:plc:a", "a.test", "ACCESS-SECRET", "REFRESH-SECRET")
    assert "SECRET" not in repr(s) and "SECRET" not in str(s)
    assert Session.from_dict(s.to_dict()) == s


def test_the_write_budget_follows_the_pds_headers_and_a_new_window() -> None:
    import time as _time

    from gelbridge._pds import WriteBudget

    b = WriteBudget()
    assert not b.low(100)  # nothing known: never low
    b.seen({"ratelimit-limit": "5000;w=3600", "ratelimit-remaining": "42",
            "ratelimit-reset": str(_time.time() + 60)})
    assert (b.limit, b.remaining) == (5000, 42) and b.low(100) and not b.low(10)
    b.seen({"ratelimit-reset": str(_time.time() - 1)})  # the window is over: not low any more
    assert not b.low(100)
    b.seen({"ratelimit-remaining": "many"})  # garbage is ignored
    assert b.remaining == 42
