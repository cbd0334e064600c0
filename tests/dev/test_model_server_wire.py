"""Behaviour of the local model server below the SDKs: auth per provider, recording,
echo model, failure items, framing details, lifecycle bounds."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gelbridge._dev.model_server import (
    CutStream,
    Delay,
    Fail,
    MalformedBody,
    ModelServer,
    RecordedRequest,
    ToolCall,
    Turn,
    last_user_text,
)

KEY = "k-secret"
USER = {"role": "user", "content": "hello there"}

# provider -> (path, auth headers, request body)
ROUTES: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "openai": ("/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}, {"model": "m", "messages": [USER]}),
    "anthropic": ("/v1/messages", {"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                  {"model": "m", "max_tokens": 9, "messages": [USER]}),
    "gemini": ("/v1beta/models/gemini-x:generateContent", {"x-goog-api-key": KEY},
               {"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]}),
    "ollama": ("/api/chat", {"Authorization": f"Bearer {KEY}"}, {"model": "m", "messages": [USER], "stream": False}),
}


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(api_key=KEY) as srv:
        yield srv


def _text_of(provider: str, body: dict[str, Any]) -> str:
    if provider == "openai":
        return body["choices"][0]["message"]["content"]
    if provider == "anthropic":
        return body["content"][0]["text"]
    if provider == "gemini":
        return body["candidates"][0]["content"]["parts"][0]["text"]
    return body["message"]["content"]


@pytest.mark.parametrize("provider", list(ROUTES))
def test_each_route_echoes_last_user_text_when_script_is_empty(server: ModelServer, provider: str) -> None:
    path, headers, body = ROUTES[provider]
    r = httpx.post(server.url + path, headers=headers, json=body)
    assert r.status_code == 200, r.text
    assert _text_of(provider, r.json()) == "You said: hello there"


@pytest.mark.parametrize("provider", list(ROUTES))
def test_wrong_or_missing_key_is_401_in_provider_shape(server: ModelServer, provider: str) -> None:
    path, headers, body = ROUTES[provider]
    server.enqueue(Turn(text="must not be consumed"))
    wrong = {k: ("nope" if v.endswith(KEY) else v) for k, v in headers.items()}
    for hdrs in (wrong, {k: v for k, v in headers.items() if k == "anthropic-version"}):
        r = httpx.post(server.url + path, headers=hdrs, json=body)
        assert r.status_code == 401
        err = r.json()
        if provider == "anthropic":
            assert err["type"] == "error" and err["error"]["type"] == "authentication_error"
        elif provider == "gemini":
            assert err["error"]["code"] == 401 and err["error"]["status"] == "UNAUTHENTICATED"
        elif provider == "openai":
            assert err["error"]["code"] == "invalid_api_key"
        else:
            assert isinstance(err["error"], str)
    assert server.pending == 1  # auth failures do not eat scripted turns


def test_gemini_accepts_key_query_and_redacts_it(server: ModelServer) -> None:
    path, _, body = ROUTES["gemini"]
    r = httpx.post(server.url + path + f"?key={KEY}", json=body)
    assert r.status_code == 200
    assert server.requests[-1].query == {"key": "<redacted>"}


def test_recorded_requests_hide_auth_values_and_keep_bodies(server: ModelServer) -> None:
    for path, headers, body in ROUTES.values():
        httpx.post(server.url + path, headers={**headers, "X-Trace": "t1"}, json=body)
    recorded = server.requests
    assert [r.provider for r in recorded] == list(ROUTES)
    for req in recorded:
        assert isinstance(req, RecordedRequest) and req.method == "POST"
        assert req.headers["x-trace"] == "t1"
        assert KEY not in json.dumps(dict(req.headers))
    assert recorded[0].headers["authorization"] == "<redacted>"
    assert recorded[1].headers["x-api-key"] == "<redacted>"
    assert recorded[1].body["max_tokens"] == 9
    assert recorded[2].path == "/v1beta/models/gemini-x:generateContent"


def test_server_without_key_accepts_unauthenticated_requests() -> None:
    with ModelServer() as srv:
        r = httpx.post(srv.url + "/chat/completions", json={"model": "m", "messages": [USER]})
        assert r.status_code == 200


def test_one_script_drives_every_provider_in_order(server: ModelServer) -> None:
    server.enqueue(*[Turn(text=f"answer {i}") for i in range(4)])
    texts = []
    for provider, (path, headers, body) in ROUTES.items():
        texts.append(_text_of(provider, httpx.post(server.url + path, headers=headers, json=body).json()))
    assert texts == ["answer 0", "answer 1", "answer 2", "answer 3"]
    assert server.pending == 0


def test_last_user_text_tolerates_every_request_shape() -> None:
    assert last_user_text({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]},
                                        {"role": "assistant", "content": "b"}]}) == "a"
    assert last_user_text({"messages": [{"role": "user", "content": "first"},
                                        {"role": "user", "content": [{"type": "tool_result", "content": "r"}]}]}) == "first"
    assert last_user_text({"contents": [{"role": "user", "parts": [{"text": "g1"}, {"text": "g2"}]},
                                        {"role": "model", "parts": [{"text": "m"}]}]}) == "g1\ng2"
    assert last_user_text({"contents": [{"parts": [{"text": "no role"}]}]}) == "no role"
    for junk in (None, [], "x", {"messages": "nope"}, {"messages": [None, 3, {"role": "user"}]}):
        assert last_user_text(junk) == ""


def test_stream_chunk_count_follows_chunk_size() -> None:
    text = "x" * 400
    counts = []
    for size in (100, 4):
        with ModelServer(chunk_size=size) as srv:
            srv.enqueue(Turn(text=text))
            r = httpx.post(srv.url + "/v1/chat/completions",
                           json={"model": "m", "messages": [USER], "stream": True})
            counts.append(r.text.count('"content":"x'))
            assert r.text.rstrip().endswith("data: [DONE]")
    assert counts == [4, 100]


def test_gemini_stream_without_alt_sse_is_a_json_array(server: ModelServer) -> None:
    server.enqueue(Turn(text="abcdef", chunk_size=2))
    r = httpx.post(server.url + "/v1beta/models/g:streamGenerateContent", headers={"x-goog-api-key": KEY},
                   json=ROUTES["gemini"][2])
    items = json.loads(r.text)
    assert [i["candidates"][0]["content"]["parts"][0]["text"] for i in items] == ["ab", "cd", "ef"]
    assert items[-1]["candidates"][0]["finishReason"] == "STOP" and "usageMetadata" in items[-1]


def test_anthropic_stream_uses_event_lines(server: ModelServer) -> None:
    server.enqueue(Turn(text="hi", tool_calls=[ToolCall("f", {"a": 1})]))
    path, headers, body = ROUTES["anthropic"]
    r = httpx.post(server.url + path, headers=headers, json={**body, "stream": True})
    events = [line[len("event: "):] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "ping"]
    assert events[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in events and r.headers["content-type"].startswith("text/event-stream")


def test_cut_stream_drops_connection_mid_body(server: ModelServer) -> None:
    server.enqueue(CutStream(after_chunks=3, turn=Turn(text="0123456789" * 5, chunk_size=5)))
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", server.url + "/v1/chat/completions", headers=ROUTES["openai"][1],
                          json={"model": "m", "messages": [USER], "stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    received.append(line)
    assert len(received) == 3 and "[DONE]" not in "".join(received)

    server.enqueue(CutStream())
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(server.url + "/v1/chat/completions", headers=ROUTES["openai"][1],
                   json={"model": "m", "messages": [USER]})


def test_malformed_body_is_200_and_not_json(server: ModelServer) -> None:
    server.enqueue(MalformedBody(), MalformedBody(body="{oops"))
    r = httpx.post(server.url + "/api/chat", headers=ROUTES["ollama"][1], json=ROUTES["ollama"][2])
    assert r.status_code == 200
    with pytest.raises(ValueError):
        r.json()
    r = httpx.post(server.url + "/api/chat", headers=ROUTES["ollama"][1],
                   json={**ROUTES["ollama"][2], "stream": True})
    assert r.text == "{oops\n"


def test_fail_sets_retry_after_and_provider_error_body(server: ModelServer) -> None:
    server.enqueue(Fail(429, retry_after=1.5, message="too many"))
    path, headers, body = ROUTES["gemini"]
    r = httpx.post(server.url + path, headers=headers, json=body)
    assert r.status_code == 429 and r.headers["retry-after"] == "1.5" and r.headers["retry-after-ms"] == "1500"
    assert r.json() == {"error": {"code": 429, "message": "too many", "status": "RESOURCE_EXHAUSTED"}}


def test_invalid_json_is_400_in_provider_shape(server: ModelServer) -> None:
    path, headers, _ = ROUTES["anthropic"]
    r = httpx.post(server.url + path, headers=headers, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert server.requests[-1].body == "{not json"


def test_unknown_route_is_404(server: ModelServer) -> None:
    assert httpx.post(server.url + "/v2/nothing", json={}).status_code == 404


def test_delay_waits_then_answers(server: ModelServer) -> None:
    server.enqueue(Delay(0.3, then=Turn(text="late")))
    start = time.monotonic()
    r = httpx.post(server.url + "/chat/completions", headers=ROUTES["openai"][1], json=ROUTES["openai"][2])
    assert time.monotonic() - start >= 0.3
    assert r.json()["choices"][0]["message"]["content"] == "late"


def test_custom_responder_replaces_echo() -> None:
    def responder(req: RecordedRequest) -> Turn:
        return Turn(text=f"{req.provider}:{len(req.body['messages'])}")

    with ModelServer(responder=responder) as srv:
        r = httpx.post(srv.url + "/api/chat", json={"model": "m", "messages": [USER, USER], "stream": False})
        assert r.json()["message"]["content"] == "ollama:2"


def test_stop_is_bounded_with_pending_delay_and_idle_keepalive() -> None:
    srv = ModelServer().start()
    srv.enqueue(Delay(60))
    idle = socket.create_connection(("127.0.0.1", srv.port))  # keep-alive connection doing nothing
    errors: list[BaseException] = []

    def slow_call() -> None:
        try:
            httpx.post(srv.url + "/chat/completions", json={"model": "m", "messages": [USER]}, timeout=30)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion below
            errors.append(e)

    t = threading.Thread(target=slow_call)
    t.start()
    deadline = time.monotonic() + 5
    while not srv.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    srv.stop()
    assert time.monotonic() - start < 2.0
    t.join(5)
    assert not t.is_alive() and errors  # the in-flight call fails instead of hanging
    idle.close()
    srv.stop()  # idempotent


async def test_async_context_manager_serves_httpx_async_clients() -> None:
    async with ModelServer(api_key=KEY) as srv:
        async with httpx.AsyncClient(base_url=srv.url, headers=ROUTES["openai"][1]) as client:
            rs = [await client.post("/v1/chat/completions", json=ROUTES["openai"][2]) for _ in range(20)]
    assert {r.json()["choices"][0]["message"]["content"] for r in rs} == {"You said: hello there"}


def test_keepalive_serves_many_requests_on_one_connection(server: ModelServer) -> None:
    path, headers, body = ROUTES["openai"]
    start = time.monotonic()
    with httpx.Client(base_url=server.url, headers=headers) as client:
        for _ in range(200):
            assert client.post(path, json={**body, "stream": True}).status_code == 200
    assert time.monotonic() - start < 10
    assert len(server.requests) == 200
    assert threading.active_count() < 50


@pytest.mark.parametrize(
    ("field", "expect_content", "expect_extra"),
    [
        ("reasoning_content", "ok", {"reasoning_content": "hmm"}),
        ("reasoning", "ok", {"reasoning": "hmm"}),
        ("think_tags", "<think>hmm</think>ok", {}),
        ("omit", "ok", {}),
    ],
)
def test_openai_reasoning_rendering_options(field: str, expect_content: str, expect_extra: dict[str, str]) -> None:
    with ModelServer(openai_reasoning_field=field) as srv:
        srv.enqueue(Turn(text="ok", reasoning="hmm"))
        msg = httpx.post(srv.url + "/v1/chat/completions", json={"model": "m", "messages": [USER]}).json()[
            "choices"][0]["message"]
    assert msg["content"] == expect_content
    assert {k: msg[k] for k in ("reasoning_content", "reasoning") if k in msg} == expect_extra


def test_gemini_function_call_ids_can_be_omitted() -> None:
    with ModelServer(gemini_call_ids=False) as srv:
        srv.enqueue(Turn(tool_calls=[ToolCall("f", {"a": 1}), ToolCall("g", id="given")]))
        parts = httpx.post(srv.url + "/v1beta/models/g:generateContent", json=ROUTES["gemini"][2]).json()[
            "candidates"][0]["content"]["parts"]
    assert parts == [{"functionCall": {"name": "f", "args": {"a": 1}}},
                     {"functionCall": {"name": "g", "args": {}, "id": "given"}}]
