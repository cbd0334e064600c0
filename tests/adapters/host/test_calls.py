"""Calling transforms: return types, error messages, hooks, log, http, threads."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gelbridge._adapters.host import load_adapter
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge._errors import AdapterError, SandboxViolation

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize("ret,kind", [("{}", "table"), ("nil", "nil"), ("42", "number"), ("true", "boolean")])
def test_non_string_return_is_an_error_naming_the_function(make_adapter, ret: str, kind: str) -> None:
    a = make_adapter(f"return {ret}")
    with pytest.raises(AdapterError, match=f"transform_request returned {kind}; it must return a string"):
        a.transform_request("")


def test_lua_error_carries_file_and_line(make_adapter) -> None:
    a = make_adapter("local x = 1\nerror('boom')")
    with pytest.raises(AdapterError, match=r"t_1\.lua:4: boom") as info:
        a.transform_request("")
    assert not isinstance(info.value, SandboxViolation)


def test_runtime_error_carries_line(make_adapter) -> None:
    a = make_adapter("local t = json.decode(raw)\nreturn t.choices[1].x")
    with pytest.raises(AdapterError, match=r"t_1\.lua:4: attempt to index"):
        a.transform_request("{}")


def test_error_with_table_value_is_described(make_adapter) -> None:
    a = make_adapter("error({code = 'bad_thing', n = 3})")
    with pytest.raises(AdapterError, match=r't_1\.lua:3: error object \{"code":"bad_thing","n":3\}'):
        a.transform_request("")


def test_error_with_level_zero_gets_location(make_adapter) -> None:
    a = make_adapter("error('plain', 0)")
    with pytest.raises(AdapterError, match=r"t_1\.lua:3: plain"):
        a.transform_request("")


def test_missing_stream_transform(make_adapter) -> None:
    a = make_adapter("return raw")
    assert not a.has_stream_transform
    with pytest.raises(AdapterError, match="no transform_stream_chunk"):
        a.transform_stream_chunk("{}")


def test_stream_chunk_transform() -> None:
    a = load_adapter(SCRIPTS / "identity.lua", limits=SandboxLimits(), allow_hosts={})
    line = '{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}'
    assert json.loads(a.transform_stream_chunk(line)) == {"content": "Hel", "done": False}
    assert a.transform_stream_chunk("not json") == ""


def test_build_headers_hook(make_adapter) -> None:
    a = make_adapter("return raw", extra="""
        function adapter.build_headers(meta)
          if meta.source.name == 'nil' then return nil end
          if meta.source.name == 'bad' then return 5 end
          return { ["x-sig"] = meta.method .. ':' .. meta.url, ["x-n"] = 7, ["x-key"] = tostring(meta.api_key) }
        end
    """)
    assert a.has_build_headers
    meta = {"url": "http://127.0.0.1/x", "method": "POST", "body": "{}", "timestamp": 1, "source": {"name": "p"}}
    assert a.build_headers(meta) == {"x-sig": "POST:http://127.0.0.1/x", "x-n": "7", "x-key": "nil"}
    assert a.build_headers({**meta, "source": {"name": "nil"}}) is None
    with pytest.raises(AdapterError, match="build_headers returned number; it must return a table"):
        a.build_headers({**meta, "source": {"name": "bad"}})


def test_url_from_endpoint_template_and_build_url(make_adapter) -> None:
    a = make_adapter("return raw", extra="adapter.endpoint = '/v1beta/models/{model}:generateContent?alt=json'\n")
    assert a.url("https://g.example/", "gemini-2.5") == "https://g.example/v1beta/models/gemini-2.5:generateContent?alt=json"
    b = make_adapter("return raw", extra="""
        function adapter.build_url(model, stream)
          if model == 'evil' then return 'https://elsewhere.example/steal' end
          if stream then return '/v1/{model}:stream?alt=sse' end
          return nil
        end
    """)
    assert b.url("http://h", "m/1", stream=True) == "http://h/v1/m%2F1:stream?alt=sse"
    assert b.url("http://h", "m", stream=False) == "http://h/chat/completions"
    with pytest.raises(AdapterError, match="must be a path"):
        b.url("http://h", "evil")


def test_log_goes_to_python_logging_truncated(make_adapter, caplog: pytest.LogCaptureFixture) -> None:
    a = make_adapter("log('warn', 'hello ' .. ('x'):rep(3000)) log('info', 'second') print('dbg', 1) return 'ok'",
                     name="logger")
    with caplog.at_level(logging.DEBUG, logger="gelbridge.adapters.logger"):
        a.transform_request("")
    recs = [r for r in caplog.records if r.name == "gelbridge.adapters.logger"]
    assert [r.levelno for r in recs] == [logging.WARNING, logging.INFO, logging.DEBUG]
    assert recs[0].getMessage().startswith("hello xxx") and len(recs[0].getMessage()) <= 501
    assert recs[2].getMessage() == "dbg"


def test_log_is_rate_limited(make_adapter, caplog: pytest.LogCaptureFixture) -> None:
    a = make_adapter("for i = 1, 500 do log('info', 'line ' .. i) end return 'ok'", name="chatty")
    with caplog.at_level(logging.INFO, logger="gelbridge.adapters.chatty"):
        a.transform_request("")
    recs = [r for r in caplog.records if r.name == "gelbridge.adapters.chatty"]
    assert 40 <= len(recs) <= 60


@pytest.fixture
def local_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"x" * (2 * 1024 * 1024) if self.path == "/big" else b'{"pong":true}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            data = self.rfile.read(int(self.headers["content-length"]))
            self.send_response(201)
            self.send_header("content-length", str(len(data) + 5))
            self.end_headers()
            self.wfile.write(b"echo:" + data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def _probe(allow: list[str]):
    return load_adapter(SCRIPTS / "http_probe.lua", limits=SandboxLimits(), allow_hosts={"http_probe": allow})


def test_http_disabled_by_default(local_server: str) -> None:
    with pytest.raises(AdapterError, match="http_get is disabled for adapter 'http_probe'.*allow_hosts"):
        _probe([]).transform_request(json.dumps({"url": local_server + "/ping"}))


def test_http_allowed_for_listed_loopback_host(local_server: str) -> None:
    a = _probe(["127.0.0.1"])
    assert json.loads(a.transform_request(json.dumps({"url": local_server + "/ping"}))) == {
        "body": '{"pong":true}', "status": 200,
    }
    out = json.loads(a.transform_request(json.dumps({"url": local_server + "/p", "method": "POST", "body": "hi"})))
    assert out == {"body": "echo:hi", "status": 201}


def test_http_other_host_refused_and_size_capped(local_server: str) -> None:
    a = _probe(["localhost"])
    with pytest.raises(AdapterError, match="not in allow_hosts"):
        a.transform_request(json.dumps({"url": local_server + "/ping"}))
    b = _probe(["127.0.0.1"])
    with pytest.raises(AdapterError, match="larger than"):
        b.transform_request(json.dumps({"url": local_server + "/big"}))


def test_many_threads_one_adapter(make_adapter) -> None:
    a = make_adapter("local t = json.decode(raw) t.seen = true return json.encode(t)", pool_size=3)

    def call(i: int) -> dict:
        return json.loads(a.transform_request(json.dumps({"i": i, "pad": "y" * (i % 50)})))

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(call, range(600)))
    assert results == [{"i": i, "pad": "y" * (i % 50), "seen": True} for i in range(600)]


def test_threads_with_violations_mixed_in(make_adapter) -> None:
    a = make_adapter("if raw == 'spin' then while true do end end return raw", time_limit=0.2, pool_size=2)

    def call(i: int) -> str:
        try:
            return a.transform_request("spin" if i % 10 == 0 else str(i))
        except SandboxViolation:
            return "violation"

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(call, range(40)))
    assert results == ["violation" if i % 10 == 0 else str(i) for i in range(40)]
