"""OpenTelemetry traces of a worker on the real local PDS, exported with the real OTLP/HTTP
exporter to a loopback collector that decodes the protobuf: one span per turn, with the
model call (GenAI semantic conventions), the tool run and the PDS calls as its children;
nothing from the sealed content in any span."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gelbridge import _tracing as tracing
from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


class Collector:
    """An OTLP/HTTP traces receiver on loopback: keeps every request body, decoded."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                outer.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[Any]:
        out = []
        for body in self.bodies:
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    out.extend(ss.spans)
        return out


def attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    try:
        yield c
    finally:
        tracing.shutdown()
        c.server.shutdown()
        c.server.server_close()


async def test_a_turn_is_one_span_with_model_tool_and_pds_children_and_no_content(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, collector: Collector,
) -> None:
    canary = "canary-6f2e-secret"
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             defaults={"tools": ["current_time"]},
                             observability={"traces": True, "otlp_endpoint": collector.url, "service_name": "gb-test",
                                            "listen": "127.0.0.1:0"})
    model_server.enqueue(Turn(tool_calls=[ToolCall("current_time", {"timezone": "UTC", "note": canary}, id="c1")],
                              usage=(40, 7, 0)))
    model_server.enqueue(Turn(text=f"the answer is {canary}", usage=(60, 9, 0)))
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        k = await app.send(f"tell me {canary}", conversation=new_tid())
        _rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
        await worker.wait_idle(10)
        tool_runs = {o: worker.metrics.registry.get_sample_value(
            "gelbridge_tool_runs_total", {"account": pds_account.handle, "outcome": o}) for o in ("ok", "error")}
    tracing.flush()
    assert sum(v or 0 for v in tool_runs.values()) == 1  # /metrics counts the tool run by outcome
    assert canary in text_of(content)
    spans = collector.spans()
    [turn] = [s for s in spans if s.name == "gelbridge.turn"]
    children = [s for s in spans if s.parent_span_id == turn.span_id]
    chats = [s for s in children if s.name == "chat echo-1"]
    tools = [s for s in children if s.name == "execute_tool current_time"]
    pds = [s for s in children if s.name.startswith("pds ")]
    assert len(chats) == 2 and len(tools) == 1 and pds
    t = attrs(turn)
    assert t["gelbridge.turn.status"] == "complete" and t["gelbridge.reply.rkey"] == f"{k}.r0"
    assert t["gelbridge.pds.write_points"] >= 6  # claim, checkpoint before the tool, final
    c = attrs(chats[0])
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.provider.name"] == "openai"
    assert c["gen_ai.request.model"] == "echo-1" and c["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert c["gen_ai.usage.input_tokens"] == 40 and c["gen_ai.usage.output_tokens"] == 7
    assert c["server.address"] == "127.0.0.1" and chats[0].kind == 3  # SPAN_KIND_CLIENT
    assert attrs(chats[1])["gen_ai.response.finish_reasons"] == ["stop"]
    assert attrs(tools[0])["gen_ai.tool.name"] == "current_time"
    assert {attrs(s)["rpc.method"] for s in pds} >= {"com.atproto.repo.putRecord"}
    assert all(s.trace_id == turn.trace_id for s in children)
    req = ExportTraceServiceRequest.FromString(collector.bodies[0])
    service = {kv.key: kv.value.string_value for kv in req.resource_spans[0].resource.attributes}
    assert service["service.name"] == "gb-test"
    for body in collector.bodies:  # the canary is in the prompt, the tool input and the answer: never here
        assert canary.encode() not in body and b"tell me" not in body and b"the answer is" not in body


def test_traces_without_the_otel_extra_are_an_operators_error_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from gelbridge._check import check_settings
    from gelbridge._config import Settings
    from gelbridge._errors import ConfigError

    monkeypatch.setattr(tracing, "available", lambda: False)
    settings = Settings.model_validate({"observability": {"traces": True}})
    rep = asyncio.run(check_settings(settings, environ={}, login=False))
    assert tracing.EXTRA_HINT in rep.problems
    with pytest.raises(ConfigError, match="pip install 'gelbridge\\[otel\\]'"):
        tracing.configure(settings.observability)
