"""Every ProviderError of the shell says what happened (``fault``) in words a log may hold:
the provider, ``host:port``, the kind of failure, the status and a known code; never the
body. Each failure is a real one on 127.0.0.1."""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest
from transport_server import Script, reply_json, reply_raw, reply_stream, stall

from gelbridge._errors import ProviderError, ProviderFault, failure_of
from gelbridge._transport import ProviderTransport, RetryPolicy, connect_fault, host_port

ONCE = RetryPolicy(max_retries=0)
CANARY = "cnryq7x9zkw4"


def transport(base: str, **kw: object) -> ProviderTransport:
    kw.setdefault("retry", ONCE)
    kw.setdefault("read_timeout", 5.0)
    return ProviderTransport("local", base, **kw)  # type: ignore[arg-type]


async def failure(tr: ProviderTransport, path: str, *, stream: bool = False) -> ProviderError:
    with pytest.raises(ProviderError) as exc:
        if stream:
            async with tr.stream(tr.url(path), b"{}") as s:
                async for _ in s:
                    pass
        else:
            await tr.post_json(tr.url(path), b"{}")
    return exc.value


async def test_a_closed_port_is_connection_refused_at_host_and_port(closed_port: int) -> None:
    async with transport(f"http://127.0.0.1:{closed_port}/v1") as tr:
        for stream in (False, True):
            e = await failure(tr, "/chat", stream=stream)
            assert e.fault == ProviderFault("refused", host=f"127.0.0.1:{closed_port}", provider="local")
            assert failure_of(e) == f"ProviderError: provider 'local': connection refused at 127.0.0.1:{closed_port}"


async def test_https_to_a_plain_http_port_is_a_tls_failure(provider: tuple[str, Script]) -> None:
    base, script = provider
    port = int(base.rsplit(":", 1)[1])
    async with transport(f"https://127.0.0.1:{port}") as tr:
        e = await failure(tr, "/chat")
    assert e.fault is not None and (e.fault.what, e.fault.host) == ("tls", f"127.0.0.1:{port}")
    assert e.fault.detail is not None and e.fault.detail.isupper()  # OpenSSL's reason, e.g. WRONG_VERSION_NUMBER


async def test_an_http_error_names_its_status_and_known_code_but_never_its_body(
        provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(401, {"error": {"message": f"Incorrect API key provided: sk-{CANARY}",
                                                  "type": "invalid_request_error", "code": "invalid_api_key"}}))
    script.on("/odd", reply_json(400, {"error": {"message": "no", "code": f"echo {CANARY}"}}))
    async with transport(base) as tr:
        auth = await failure(tr, "/chat")
        odd = await failure(tr, "/odd")
    port = base.rsplit(":", 1)[1]
    assert auth.fault == ProviderFault("status", host=f"127.0.0.1:{port}", status=401, code="invalid_api_key",
                                       provider="local")
    assert CANARY in str(auth)  # the message quotes the provider (it stays out of logs)
    assert CANARY not in failure_of(auth) and CANARY not in failure_of(odd)
    assert odd.fault is not None and odd.fault.code is None and odd.provider_code == f"echo {CANARY}"


async def test_retries_count_in_the_fault(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/chat", reply_json(503, {"error": {"message": "busy"}}), reply_json(503, {"error": {"message": "x"}}))
    async with transport(base, retry=RetryPolicy(max_retries=1, base_delay=0.01, jitter=0)) as tr:
        e = await failure(tr, "/chat")
    assert e.fault is not None and (e.fault.status, e.fault.attempts) == (503, 2)
    assert failure_of(e).endswith(", after 2 attempts")


async def test_body_stream_and_timeout_failures_each_have_their_word(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/html", reply_raw(200, b"<html>a web page</html>", {"Content-Type": "text/html"}))
    script.on("/cut", reply_stream([b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"], cut_after=2))
    script.on("/json", reply_json(200, {"error": {"message": "not a stream"}}))
    script.on("/slow", stall(2.0, after_headers=False))
    async with transport(base, read_timeout=0.3) as tr:
        assert (await failure(tr, "/html")).fault.what == "not_json"  # type: ignore[union-attr]
        assert (await failure(tr, "/cut", stream=True)).fault.what == "cut"  # type: ignore[union-attr]
        assert (await failure(tr, "/json", stream=True)).fault.what == "not_a_stream"  # type: ignore[union-attr]
        slow = await failure(tr, "/slow")
    assert slow.fault is not None and slow.fault.what == "read_timeout" and slow.fault.provider == "local"
    async with transport(base, deadline=0.3) as tr:
        script.on("/slow", stall(2.0, after_headers=False))
        late = await failure(tr, "/slow")
    assert late.fault is not None and late.fault.what == "deadline"


async def test_get_json_follows_the_same_rules(provider: tuple[str, Script]) -> None:
    base, script = provider
    script.on("/models", reply_json(200, {"data": []}), reply_json(404, {"error": {"message": "Invalid URL"}}))
    async with transport(base) as tr:
        assert await tr.get_json(tr.url("/models")) == b'{"data": []}'
        with pytest.raises(ProviderError) as exc:
            await tr.get_json(tr.url("/models"))
    assert exc.value.status == 404 and exc.value.fault is not None and exc.value.fault.what == "status"
    assert [h.method for h in script.hits("/models")] == ["GET", "GET"]


def test_host_port_fills_the_scheme_port_and_drops_user_info() -> None:
    assert host_port("https://api.openai.com/v1/models") == "api.openai.com:443"
    assert host_port("http://user:secret@127.0.0.1/x?key=k") == "127.0.0.1:80"
    assert host_port("http://[::1]:8080/x") == "[::1]:8080"


def test_connect_fault_reads_the_cause_under_httpx() -> None:
    def chained(cause: BaseException) -> httpx.ConnectError:
        try:
            try:
                raise cause
            except BaseException as inner:
                raise httpx.ConnectError(str(inner)) from inner
        except httpx.ConnectError as outer:
            return outer

    assert connect_fault(chained(socket.gaierror(-2, "Name or service not known"))).what == "dns"
    cert = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate")
    assert connect_fault(chained(cert)) == ProviderFault("tls", detail="CERTIFICATE_VERIFY_FAILED")
    assert connect_fault(chained(OSError(101, "Network is unreachable"))) == ProviderFault(
        "unreachable", detail="ENETUNREACH")
    assert connect_fault(httpx.ConnectTimeout("timed out")).what == "connect_timeout"
