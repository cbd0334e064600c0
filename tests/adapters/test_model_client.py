"""ModelClient against the local ModelServer (real httpx, real Lua): success and error paths."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from gelbridge._adapters.client import ModelClient
from gelbridge._adapters.registry import AdapterRegistry
from gelbridge._dev.model_server import (
    CutStream,
    Fail,
    MalformedBody,
    MidStreamError,
    ModelServer,
    ToolCall,
    Turn,
)
from gelbridge._errors import AdapterError, ConfigError, ProviderError
from gelbridge.lux import LuxRequest, Message, Options, Text, ToolResult, ToolUse
from testkit.adapter_helpers import ask, settings_for

# ------------------------------------------------------------------ success


@pytest.mark.parametrize("stream", [True, False])
async def test_text_and_tool_calls(openai_client: ModelClient, model_server: ModelServer, stream: bool) -> None:
    model_server.enqueue(Turn(text="Two calls coming.", reasoning="plan", usage=(11, 7, 2),
                              tool_calls=[ToolCall("a", {"x": 1}, id="c1"), ToolCall("b", {}, id="c2")]))
    res = await openai_client.complete(ask(), provider="local", stream=stream)
    r = res.response
    assert [type(b).__name__ for b in r.message.content] == ["Thinking", "Text", "ToolUse", "ToolUse"]
    assert [(c.id, c.name, c.arguments) for c in r.message.content[2:]] == [("c1", "a", '{"x":1}'), ("c2", "b", "{}")]
    assert r.choices[0].finish_reason == "tool_calls"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.reasoning_tokens) == (11, 7, 2)
    assert res.streamed is stream and res.timing.total_ms >= res.timing.adapter_ms > 0
    sent = model_server.requests[-1]
    assert sent.body["stream"] is stream and "disable_thinking" not in sent.body
    assert sent.headers["authorization"] == "<redacted>"  # the server checked it; 401 otherwise


async def test_api_key_never_reaches_the_script(tmp_path: Path, model_server: ModelServer) -> None:
    script = tmp_path / "spy.lua"
    script.write_text((Path(__file__).parent / "scripts" / "openai_md.lua").read_text()
                      .replace('name = "openai_md"', 'name = "spy"')
                      .replace("return adapter", """
function adapter.build_headers(meta)
  return { ["x-saw-key"] = tostring(meta.api_key ~= nil), ["x-saw-sk"] = tostring(string.find(json.encode(meta), "sk%-test") ~= nil) }
end
return adapter"""))
    reg = AdapterRegistry.load(None, [tmp_path])
    for flag, expect in ((False, "false"), (True, "true")):
        settings = settings_for(s={"adapter": "spy", "base_url": model_server.url, "api_key_env": "K",
                                   "pass_api_key_to_script": flag})
        async with ModelClient(settings, registry=reg, env={"K": "sk-test"}) as c:
            await c.complete(ask(stream=False), provider="s")
        h = model_server.requests[-1].headers
        assert h["x-saw-key"] == expect and h["x-saw-sk"] == expect


async def test_one_transport_and_runtime_pool_reused(openai_client: ModelClient, model_server: ModelServer) -> None:
    await openai_client.complete(ask(), provider="local")
    t1 = openai_client.transports.get("local")
    await asyncio.gather(*(openai_client.complete(ask(f"q{i}"), provider="local") for i in range(6)))
    assert openai_client.transports.get("local") is t1
    assert len(model_server.requests) == 7


# ------------------------------------------------------------------ config errors


async def test_unknown_provider_names_the_known_ones(openai_client: ModelClient) -> None:
    with pytest.raises(ConfigError, match=r"'nope'.*local"):
        await openai_client.complete(ask(), provider="nope")


async def test_model_must_be_allowed(model_server: ModelServer, make_client: Callable[..., ModelClient]) -> None:
    c = make_client(settings_for(p={"adapter": "openai_md", "base_url": model_server.url, "api_key_env": "TEST_KEY",
                                    "models": ["m-ok"]}))
    with pytest.raises(ConfigError, match="m-1"):
        await c.complete(ask(model="m-1"), provider="p")
    await c.complete(ask(model="m-ok"), provider="p")
    await c.aclose()


async def test_missing_key_variable(model_server: ModelServer, make_client: Callable[..., ModelClient]) -> None:
    c = make_client(settings_for(p={"adapter": "openai_md", "base_url": model_server.url, "api_key_env": "NOPE"}),
                    env={})
    with pytest.raises(ConfigError, match="NOPE"):
        await c.complete(ask(), provider="p")
    await c.aclose()


# ------------------------------------------------------------------ provider errors


async def test_401_is_authentication_and_not_retried(model_server: ModelServer,
                                                     make_client: Callable[..., ModelClient]) -> None:
    c = make_client(settings_for(p={"adapter": "openai_md", "base_url": model_server.url, "api_key_env": "TEST_KEY"}),
                    env={"TEST_KEY": "wrong"})
    with pytest.raises(ProviderError) as ei:
        await c.complete(ask(), provider="p")
    assert ei.value.kind == "authentication" and ei.value.status == 401
    assert len(model_server.requests) == 1
    await c.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_429_with_retry_after_is_retried(openai_client: ModelClient, model_server: ModelServer,
                                               stream: bool) -> None:
    model_server.enqueue(Fail(429, "slow down", retry_after=0.2), Turn(text="finally"))
    res = await openai_client.complete(ask(), provider="local", stream=stream)
    assert res.response.message.content == [Text("finally")]
    assert res.timing.attempts == 2 and res.timing.retry_wait_ms == pytest.approx(200, abs=1)
    assert len(model_server.requests) == 2


async def test_500_gives_up_after_max_retries(openai_client: ModelClient, model_server: ModelServer) -> None:
    model_server.enqueue(*[Fail(500, "down", retry_after=0.01)] * 3)
    with pytest.raises(ProviderError) as ei:
        await openai_client.complete(ask(), provider="local", stream=False)
    assert ei.value.kind == "server_error" and ei.value.status == 500
    assert len(model_server.requests) == 3  # max_retries = 2


async def test_malformed_body_non_stream(openai_client: ModelClient, model_server: ModelServer) -> None:
    model_server.enqueue(MalformedBody())
    with pytest.raises(ProviderError) as ei:
        await openai_client.complete(ask(), provider="local", stream=False)
    assert ei.value.kind == "server_error" and "not JSON" in str(ei.value)


async def test_malformed_frame_in_a_stream_is_an_error_not_an_empty_answer(openai_client: ModelClient,
                                                                           model_server: ModelServer) -> None:
    model_server.enqueue(MalformedBody())
    with pytest.raises(ProviderError) as ei:
        await openai_client.complete(ask(), provider="local")
    assert ei.value.kind == "server_error"
    assert ei.value.partial.choices[0].finish_reason == "error"  # type: ignore[attr-defined]
    assert any(d.status == "invalid" for d in ei.value.diagnostics)  # type: ignore[attr-defined]


async def test_stream_cut_midway_keeps_the_partial_response(openai_client: ModelClient,
                                                            model_server: ModelServer) -> None:
    model_server.enqueue(CutStream(after_chunks=4, turn=Turn(text="abcdefghijklmnopqrstuvwxyz")))
    with pytest.raises(ProviderError) as ei:
        await openai_client.complete(ask(), provider="local")
    partial = ei.value.partial  # type: ignore[attr-defined]
    assert partial.message.content == [Text("abcdefghijkl")]  # 3 content frames of 4 chars arrived
    assert partial.choices[0].finish_reason == "error" and partial.error.kind == "server_error"
    assert len(model_server.requests) == 1  # never retried once the stream started


async def test_error_event_mid_stream(openai_client: ModelClient, model_server: ModelServer) -> None:
    model_server.enqueue(MidStreamError(after_chunks=3, status=529, message="overloaded",
                                        turn=Turn(text="partial answer here")))
    with pytest.raises(ProviderError) as ei:
        await openai_client.complete(ask(), provider="local")
    assert "overloaded" in str(ei.value)
    assert ei.value.partial.message.content == [Text("partial ")]  # type: ignore[attr-defined]


async def test_adapter_failure_is_adapter_error(tmp_path: Path, model_server: ModelServer) -> None:
    (tmp_path / "broken.lua").write_text("""
local adapter = { name = "broken", endpoint = "/v1/chat/completions" }
function adapter.transform_request(raw) return raw end
function adapter.transform_response(raw) error("cannot read this") end
function adapter.transform_stream_chunk(raw) local t = nil; return t.x end
return adapter""")
    reg = AdapterRegistry.load(None, [tmp_path])
    async with ModelClient(settings_for(b={"adapter": "broken", "base_url": model_server.url, "api_key_env": "K"}),
                           registry=reg, env={"K": "sk-test"}) as c:
        with pytest.raises(AdapterError, match="cannot read this") as ei:
            await c.complete(ask(stream=False), provider="b")
        assert ei.value.kind == "adapter_error"
        with pytest.raises(AdapterError) as ei2:
            await c.complete(ask(), provider="b")
        assert ei2.value.partial.choices[0].finish_reason == "error"  # type: ignore[attr-defined]


async def test_cancellation_closes_the_stream(openai_client: ModelClient, model_server: ModelServer) -> None:
    model_server.enqueue(Turn(text="x" * 400, chunk_delay=0.05))
    task = asyncio.create_task(openai_client.complete(ask(), provider="local"))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the client still works and its pooled runtime came back
    model_server.enqueue(Turn(text="after"))
    res = await asyncio.wait_for(openai_client.complete(ask(), provider="local"), 10)
    assert res.response.message.content == [Text("after")]


# ------------------------------------------------------------------ lux-ir-v1 script


@pytest.mark.parametrize("stream", [True, False])
async def test_lux_native_script_with_state_and_id_rule(model_server: ModelServer, stream: bool,
                                                        make_client: Callable[..., ModelClient]) -> None:
    c = make_client(settings_for(x={"adapter": "openai_lux", "base_url": model_server.url, "api_key_env": "TEST_KEY"}))
    req = LuxRequest(model="m-2", options=Options(stream=stream), conversation=[
        Message("user", [Text("go")]),
        Message("assistant", [ToolUse("call.9:x", "f", "{}")]),
        Message("tool", [ToolResult("call.9:x", [Text("ok")])]),
        Message("user", [Text("again")]),
    ])
    model_server.enqueue(Turn(text="Sure thing.", tool_calls=[ToolCall("g", {"k": "v"}, id="c7"),
                                                             ToolCall("h", {}, id="c8")]))
    res = await c.complete(req, provider="x")
    r = res.response
    assert [type(b).__name__ for b in r.message.content] == ["Text", "ToolUse", "ToolUse"]
    assert [(b.id, b.arguments) for b in r.message.content[1:]] == [("c7", '{"k":"v"}'), ("c8", "{}")]
    assert r.choices[0].finish_reason == "tool_calls"
    if not stream:  # provider tags filled by the host with provider name and requested model
        pd = r.message.content[0].provider_data
        assert (pd.provider, pd.model, pd.data) == ("x", "m-2", {"fingerprint": "fp-1"})
    sent = model_server.requests[-1].body["messages"]
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"] != "call.9:x"
    assert res.diagnostics == []
    await c.aclose()


async def test_each_stream_gets_its_own_state(model_server: ModelServer,
                                              make_client: Callable[..., ModelClient]) -> None:
    c = make_client(settings_for(x={"adapter": "openai_lux", "base_url": model_server.url, "api_key_env": "TEST_KEY"}))
    for i in range(6):
        model_server.enqueue(Turn(text=f"answer {i} " * 5))
    results = await asyncio.gather(*(c.complete(ask(), provider="x") for _ in range(6)))  # > pool_size streams
    texts = sorted(r.response.message.content[0].text for r in results)
    assert texts == sorted(f"answer {i} " * 5 for i in range(6))
    await c.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_an_adapter_md_script_sees_an_ndjson_stream_line_by_line(
    model_server: ModelServer, make_client: Callable[..., ModelClient], stream: bool,
) -> None:
    """ADAPTER.md knows only SSE ``data:`` payloads; Ollama streams NDJSON. A script
    written to it (no stream_format declared) gets each NDJSON line as a payload."""
    c = make_client(settings_for(local={"adapter": "ollama_md", "base_url": model_server.url, "api_key_env": "TEST_KEY",
                                       "max_retries": 0}))
    try:
        model_server.enqueue(Turn(text="one two three four five", usage=(5, 4, 0), chunk_size=4))
        res = await c.complete(ask(), provider="local", stream=stream)
    finally:
        await c.aclose()
    r = res.response
    assert [b.text for b in r.message.content] == ["one two three four five"]
    assert r.choices[0].finish_reason == "stop" and r.usage.prompt_tokens == 5
    assert res.streamed is stream
    if stream:
        assert res.timing.chunks > 3  # one payload per NDJSON line, not one blob
        assert model_server.requests[-1].path == "/api/chat" and model_server.requests[-1].body["stream"] is True


# ------------------------------------------------------------------ the adapter reads errors


ERROR_HOOK = """
function adapter.transform_error(status, body)
  if string.find(body, "explode", 1, true) then error("the hook broke") end
  local ok, doc = pcall(json.decode, body)
  if not ok or type(doc) ~= "table" or type(doc.trouble) ~= "table" then return nil end
  return { kind = "rate_limit", message = doc.trouble.what, code = doc.trouble.tag }
end
return adapter"""


class OddErrors:
    """A provider whose errors have a shape of their own (status 418, ``{"trouble": ...}``)."""

    def __init__(self, body: bytes) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        answer = body

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(418)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *a: object) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("stream", [True, False])
async def test_an_adapter_reads_its_providers_error_body_with_transform_error(tmp_path: Path, stream: bool) -> None:
    script = tmp_path / "odd.lua"
    base = (Path(__file__).parent / "scripts" / "openai_md.lua").read_text().replace('name = "openai_md"',
                                                                                    'name = "odd"')
    script.write_text(base.replace("return adapter", ERROR_HOOK))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "plain.lua").write_text(base.replace('name = "odd"', 'name = "plain"'))
    reg = AdapterRegistry.load(None, [tmp_path, tmp_path / "plain"])
    assert reg.get("odd").has_transform_error and not reg.get("plain").has_transform_error
    got: dict[str, ProviderError] = {}
    for case, body in (("read", b'{"trouble": {"what": "the quota is gone", "tag": "Q1"}}'),
                       ("unknown shape", b'{"something": "else"}'), ("hook fails", b'{"explode": 1}')):
        srv = OddErrors(body)
        try:
            for adapter in ("odd", "plain"):
                settings = settings_for(p={"adapter": adapter, "base_url": srv.url, "max_retries": 0})
                async with ModelClient(settings, registry=reg) as c:
                    with pytest.raises(ProviderError) as e:
                        await c.complete(ask(stream=stream), provider="p")
                got[f"{case}/{adapter}"] = e.value
        finally:
            srv.close()
    read = got["read/odd"]
    assert (read.kind, read.provider_code, read.status) == ("rate_limit", "Q1", 418)
    assert "the quota is gone" in str(read)
    plain = got["read/plain"]  # the host's own parsing: it knows no "trouble" shape
    assert plain.kind == "invalid_request" and "quota" not in str(plain) and plain.provider_code is None
    for case in ("unknown shape", "hook fails"):  # nil, or an error in the hook: the host's parsing
        assert got[f"{case}/odd"].kind == got[f"{case}/plain"].kind == "invalid_request"
        assert str(got[f"{case}/odd"]) == str(got[f"{case}/plain"])
