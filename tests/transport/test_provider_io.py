"""ProviderTransport and TransportPool against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import time

import pytest
from transport_server import Script, reply_json, reply_raw, reply_stream, stall

from gelbridge._config import ProviderConfig
from gelbridge._errors import ConfigError, ProviderError
from gelbridge._transport import ProviderTransport, RetryPolicy, TransportPool, TransportTiming

OK = {"choices": [{"message": {"content": "hi"}}]}
FAST = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=1.0, jitter=0)


def transport(base: str, **kw: object) -> ProviderTransport:
    kw.setdefault("retry", FAST)
    kw.setdefault("read_timeout", 5.0)
    return ProviderTransport("test", base, **kw)  # type: ignore[arg-type]


# --- post_json --------------------------------------------------------------------------


async def test_429_with_retry_after_is_retried_after_the_requested_wait(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(429, {"error": {"message": "slow down"}}, {"Retry-After": "0.3"}),
              reply_json(200, OK))
    timing = TransportTiming()
    async with transport(base) as tr:
        out = await tr.post_json(tr.url("/chat"), b"{}", timing=timing)
    assert out == b'{"choices": [{"message": {"content": "hi"}}]}'
    hits = script.hits("/chat")
    assert len(hits) == 2 and timing.attempts == 2
    assert hits[1].at - hits[0].at >= 0.3
    assert timing.retry_wait == pytest.approx(0.3)
    assert timing.status == 200 and timing.ttfb is not None and timing.total >= timing.ttfb


async def test_retry_after_longer_than_the_ceiling_surfaces_the_error(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(429, {"error": {"message": "later"}}, {"Retry-After": "120"}))
    async with transport(base) as tr:
        with pytest.raises(ProviderError) as exc:
            await tr.post_json(tr.url("/chat"), b"{}")
    assert exc.value.kind == "rate_limit" and exc.value.retry_after == 120
    assert len(script.hits("/chat")) == 1


async def test_500_is_retried_until_success(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(500, {"error": {"message": "boom"}}),
              reply_json(502, {"error": {"message": "boom"}}), reply_json(200, OK))
    async with transport(base) as tr:
        await tr.post_json(tr.url("/chat"), b"{}")
    assert len(script.hits("/chat")) == 3


async def test_persistent_500_gives_up_after_max_retries(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(503, {"error": {"message": "down"}}))
    async with transport(base, retry=RetryPolicy(max_retries=2, base_delay=0.01, jitter=0)) as tr:
        with pytest.raises(ProviderError, match="gave up after 3 attempts") as exc:
            await tr.post_json(tr.url("/chat"), b"{}")
    assert exc.value.kind == "server_error" and exc.value.status == 503
    assert len(script.hits("/chat")) == 3


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_4xx_is_not_retried(provider: tuple[str, Script], status: int) -> None:
    base, script = provider
    script.on("/chat", reply_json(status, {"error": {"message": "no"}}))
    async with transport(base) as tr:
        with pytest.raises(ProviderError) as exc:
            await tr.post_json(tr.url("/chat"), b"{}")
    assert exc.value.status == status
    assert len(script.hits("/chat")) == 1


async def test_connection_refused_is_a_clear_error(closed_port: int) -> None:
    tr = transport(f"http://127.0.0.1:{closed_port}", retry=RetryPolicy(max_retries=1, base_delay=0.01))
    timing = TransportTiming()
    async with tr:
        with pytest.raises(ProviderError) as exc:
            await tr.post_json(tr.url("/chat"), b"{}", timing=timing)
    assert exc.value.kind == "server_error" and exc.value.status is None
    assert f"cannot reach 127.0.0.1:{closed_port}" in str(exc.value)
    assert "base_url" in str(exc.value)
    assert timing.attempts == 2


async def test_non_json_2xx_body_is_a_server_error_and_not_retried(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_raw(200, b"<html>login</html>", {"Content-Type": "text/html"}))
    async with transport(base) as tr:
        with pytest.raises(ProviderError, match="not JSON") as exc:
            await tr.post_json(tr.url("/chat"), b"{}")
    assert exc.value.kind == "server_error" and exc.value.status == 200
    assert len(script.hits("/chat")) == 1


async def test_oversized_response_is_refused(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(200, {"x": "y" * 5000}))
    async with transport(base, max_response_bytes=1000) as tr:
        with pytest.raises(ProviderError, match="larger than 1000 bytes"):
            await tr.post_json(tr.url("/chat"), b"{}")


async def test_read_timeout_is_kind_timeout(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", stall(1.0, after_headers=False))
    async with transport(base, read_timeout=0.2, retry=RetryPolicy(max_retries=0)) as tr:
        with pytest.raises(ProviderError) as exc:
            await tr.post_json(tr.url("/chat"), b"{}")
    assert exc.value.kind == "timeout"


async def test_total_deadline_stops_a_slow_call(provider: tuple[str, Script]) -> None:
    base, script = provider
    # the server would answer after 10 s: ending well before shows the 0.3 s deadline did it
    # (with room for a loaded CI machine, where 1.0 s against 0.9 once failed)
    script.on("/chat", stall(10.0, after_headers=False))
    start = time.monotonic()
    async with transport(base, read_timeout=20.0) as tr:
        with pytest.raises(ProviderError, match="deadline") as exc:
            await tr.post_json(tr.url("/chat"), b"{}", deadline=0.3)
    assert exc.value.kind == "timeout"
    assert time.monotonic() - start < 5.0


async def test_headers_are_sent_and_per_call_headers_win(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(200, OK))
    async with transport(base, headers={"Authorization": "Bearer k", "X-A": "1"}) as tr:
        await tr.post_json(tr.url("/chat"), b'{"q":1}', {"X-A": "2", "anthropic-version": "2023-06-01"})
    seen = script.hits("/chat")[0]
    h = {k.lower(): v for k, v in seen.headers.items()}
    assert h["authorization"] == "Bearer k" and h["x-a"] == "2"
    assert h["anthropic-version"] == "2023-06-01" and h["content-type"] == "application/json"
    assert seen.body == b'{"q":1}'


async def test_consecutive_calls_reuse_one_pooled_connection(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(200, OK))
    script.on("/stream", reply_stream([b"data: a\n\n", b"data: [DONE]\n\n"]))
    async with transport(base) as tr:
        await tr.post_json(tr.url("/chat"), b"{}")
        async with tr.stream(tr.url("/stream"), b"{}") as s:
            assert [x async for x in s] == ["a"]
        await tr.post_json(tr.url("/chat"), b"{}")
    ports = {h.client_port for h in script.seen}
    assert len(script.seen) == 3 and len(ports) == 1


# --- stream -----------------------------------------------------------------------------


async def test_sse_stream_with_keepalives_crlf_and_split_frames(provider: tuple[str, Script]) -> None:
    base, script = provider
    pieces = [b": OPENROUTER PROCESSING\r\n\r\n", b'data: {"a":', b'1}\r', b"\n\r\n",
              b"data:\r\n\r\n", b'data: {"b":"\xc3', b'\xa9"}\r\n\r\n', b": keep-alive\r\n\r\n",
              b"data: [DONE]\r\n\r\n"]
    script.on("/stream", reply_stream(pieces))
    async with transport(base) as tr:
        async with tr.stream(tr.url("/stream"), b"{}") as s:
            got = [x async for x in s]
    assert got == ['{"a":1}', '{"b":"é"}']
    assert s.saw_done and s.ended_cleanly
    assert s.timing.ttfb is not None and s.timing.total >= s.timing.ttfb
    assert s.timing.bytes_received > 0 and s.timing.attempts == 1


async def test_stream_without_done_ends_cleanly_and_flushes_last_event(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_stream([b"event: message_stop\ndata: {\"type\":\"message_stop\"}"]))
    async with transport(base) as tr:
        async with tr.stream(tr.url("/stream"), b"{}") as s:
            got = [x async for x in s]
    assert got == ['{"type":"message_stop"}']
    assert s.ended_cleanly and not s.saw_done


async def test_ndjson_stream(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/api/chat", reply_stream([b'{"message":{"content":"a"},"done":false}\n{"mess',
                                         b'age":{"content":"b"},"done":false}\n\n',
                                         b'{"done":true}'], content_type="application/x-ndjson"))
    async with transport(base) as tr:
        async with tr.stream(tr.url("/api/chat"), b"{}", framing="ndjson") as s:
            got = [x async for x in s]
    assert got == ['{"message":{"content":"a"},"done":false}',
                   '{"message":{"content":"b"},"done":false}', '{"done":true}']
    assert s.ended_cleanly


async def test_stream_cut_midway_raises_stream_ended_early(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_stream([b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"], cut_after=2))
    got: list[str] = []
    async with transport(base) as tr:
        with pytest.raises(ProviderError, match="stream ended early") as exc:
            async with tr.stream(tr.url("/stream"), b"{}") as s:
                async for x in s:
                    got.append(x)
    assert got == ["a", "b"]
    assert exc.value.kind == "server_error"
    assert not s.ended_cleanly
    assert len(script.hits("/stream")) == 1  # no retry once data was delivered


async def test_stream_retries_429_and_5xx_before_the_first_byte(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_json(429, {"error": {"message": "slow"}}, {"retry-after-ms": "50"}),
              reply_json(500, {"error": {"message": "oops"}}), reply_stream([b"data: ok\n\n"]))
    async with transport(base) as tr:
        async with tr.stream(tr.url("/stream"), b"{}") as s:
            got = [x async for x in s]
    assert got == ["ok"] and s.timing.attempts == 3
    assert s.timing.retry_wait >= 0.05


async def test_stream_non_2xx_is_raised_with_the_provider_message(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_json(401, {"type": "error", "error": {"type": "authentication_error",
                                                                     "message": "invalid x-api-key"}}))
    async with transport(base) as tr:
        with pytest.raises(ProviderError, match="invalid x-api-key") as exc:
            async with tr.stream(tr.url("/stream"), b"{}") as s:
                [x async for x in s]
    assert exc.value.kind == "authentication"
    assert len(script.hits("/stream")) == 1


async def test_stream_read_timeout_is_kind_timeout(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", stall(1.0))
    got: list[str] = []
    async with transport(base, read_timeout=0.2) as tr:
        with pytest.raises(ProviderError) as exc:
            async with tr.stream(tr.url("/stream"), b"{}") as s:
                async for x in s:
                    got.append(x)
    assert got == ["first"] and exc.value.kind == "timeout"


async def test_stream_deadline(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_stream([b"data: x\n\n"] * 500, gap=0.02))  # 10 s in all
    start = time.monotonic()
    async with transport(base) as tr:
        with pytest.raises(ProviderError, match="deadline") as exc:
            async with tr.stream(tr.url("/stream"), b"{}", deadline=0.3) as s:
                [x async for x in s]
    assert exc.value.kind == "timeout" and time.monotonic() - start < 5.0


async def test_json_body_instead_of_event_stream_is_an_error_not_an_empty_stream(
        provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_json(200, {"error": {"message": "upstream quota", "code": 402}}))
    async with transport(base) as tr:
        with pytest.raises(ProviderError, match="JSON instead of an event stream: upstream quota") as exc:
            async with tr.stream(tr.url("/stream"), b"{}") as s:
                [x async for x in s]
    assert exc.value.status == 200 and len(script.hits("/stream")) == 1


async def test_stream_line_limit(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/stream", reply_stream([b"data: " + b"x" * 3000]))
    async with transport(base, max_line_bytes=1000) as tr:
        with pytest.raises(ProviderError, match="longer than 1000"):
            async with tr.stream(tr.url("/stream"), b"{}") as s:
                [x async for x in s]


# --- pool -------------------------------------------------------------------------------


async def test_pool_creates_one_transport_per_provider_with_auth_from_env(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/v1/messages", reply_json(200, {"content": []}))
    cfgs = {
        "claude": ProviderConfig(adapter="anthropic", base_url=base, api_key_env="TEST_KEY",
                                 headers={"anthropic-version": "2023-06-01"}, read_timeout=7, max_retries=1),
        "local": ProviderConfig(adapter="ollama", base_url=base),
    }
    async with TransportPool(cfgs, env={"TEST_KEY": "sk-ant-1"}) as pool:
        tr = pool.get("claude")
        assert pool.get("claude") is tr and pool.get("local") is not tr
        assert tr.retry.max_retries == 1 and tr.client.timeout.read == 7
        await tr.post_json(tr.url("/v1/messages"), b"{}")
    h = {k.lower(): v for k, v in script.hits("/v1/messages")[0].headers.items()}
    assert h["x-api-key"] == "sk-ant-1" and h["anthropic-version"] == "2023-06-01"
    assert "authorization" not in h
    assert tr.client.is_closed


async def test_pool_errors_name_the_missing_env_var_and_unknown_provider() -> None:
    cfgs = {"oa": ProviderConfig(adapter="openai", base_url="https://api.openai.com/v1", api_key_env="NOPE_KEY")}
    async with TransportPool(cfgs, env={}) as pool:
        with pytest.raises(ConfigError, match="NOPE_KEY"):
            pool.get("oa")
        with pytest.raises(ConfigError, match="unknown provider 'x'"):
            pool.get("x")


async def test_a_stream_of_keep_alive_comments_ends_at_the_deadline_not_the_read_timeout(
        provider: tuple[str, Script]) -> None:
    """SSE comments keep the socket busy, so ``read_timeout`` never fires; only the total
    deadline ends such a stream (``[providers.<name>] deadline``)."""
    base, script = provider
    script.on("/stream", reply_stream([b": keep-alive\n\n"] * 1000, gap=0.01))  # 10 s in all
    start = time.monotonic()
    async with transport(base, read_timeout=1.0) as tr:
        with pytest.raises(ProviderError, match="deadline") as exc:
            async with tr.stream(tr.url("/stream"), b"{}", deadline=0.4) as s:
                [x async for x in s]
    assert exc.value.kind == "timeout" and 0.35 < time.monotonic() - start < 5.0


async def test_the_provider_deadline_setting_reaches_its_transport() -> None:
    from gelbridge._config import Settings
    from gelbridge._transport import TransportPool

    s = Settings.model_validate({"providers": {"p": {"adapter": "openai", "base_url": "http://127.0.0.1:9/v1",
                                                     "deadline": 42}}})
    pool = TransportPool(s.providers, env={})
    try:
        assert pool.get("p").deadline == 42
    finally:
        await pool.aclose()
    assert Settings.model_validate({"providers": {"p": {"adapter": "openai", "base_url": "http://x"}}}
                                   ).providers["p"].deadline == 600


# --- no cookies ----------------------------------------------------------------------------


async def test_a_cookie_the_provider_sets_is_never_sent_back(provider: tuple[str, Script]) -> None:
    """One client serves every account of its configuration (gelbridge._runtime.shared): a
    cookie from the answer to one account's request must not go out with the next one's."""
    base, script = provider
    script.on("/chat", reply_json(200, OK, {"Set-Cookie": "__cf_bm=from-account-a; Path=/"}), reply_json(200, OK))
    async with transport(base) as tr:
        await tr.post_json(tr.url("/chat"), b"{}")
        await tr.post_json(tr.url("/chat"), b"{}")
        assert len(tr.client.cookies) == 0
    first, second = script.hits("/chat")
    assert "Cookie" not in first.headers and "Cookie" not in second.headers
