"""fetch_url: readable text from a local server, and refusal of internal addresses.

Refusals are tested by resolution / address checks only: no traffic ever goes to a
non-loopback address.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gelbridge._tools.config import FetchUrlConfig
from gelbridge._tools.fetch_url import (
    FetchRefused,
    address_is_public,
    choose_address,
    content_kind,
    fetch,
    html_to_text,
    parse_target,
)

PAGE = b"""<!doctype html><html><head><title>Test &amp; Page</title>
<style>body { color: red }</style><script>alert("no")</script></head>
<body><h1>Hello</h1><p>First   paragraph.</p><ul><li>one</li><li>two</li></ul>
<noscript>hidden</noscript><p>Caf&eacute; &lt;ok&gt;</p></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        path = self.path
        if path == "/page":
            self._send(200, "text/html; charset=utf-8", PAGE)
        elif path == "/plain":
            self._send(200, "text/plain", b"just text\n" + f"host={self.headers['Host']}".encode())
        elif path == "/image":
            self._send(200, "image/png", b"\x89PNG....")
        elif path == "/big":
            self._send(200, "text/plain", b"z" * 50_000)
        elif path == "/missing":
            self._send(404, "text/plain", b"nope")
        elif path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", path.split("=", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, "text/plain", b"?")

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    t.join(timeout=5)


ALLOWED = FetchUrlConfig(allow_hosts=["127.0.0.1"], timeout=10)


class NoNetwork(httpx.AsyncBaseTransport):
    """Fails the test if a request is ever sent."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"a request was sent to {request.url}")


def fake_resolver(table: dict[str, list[str]]):
    async def resolve(host: str, port: int) -> list[str]:
        return table.get(host, [])

    return resolve


async def test_html_page_becomes_readable_text(server: str) -> None:
    out = await fetch(f"{server}/page", ALLOWED)
    assert not out.is_error
    assert "Title: Test & Page" in out.text
    body = out.text.split("\n\n", 1)[1]
    assert "Hello" in body and "First paragraph." in body and "- one" in body and "Café <ok>" in body
    assert "alert" not in body and "color: red" not in body and "hidden" not in body


async def test_plain_text_and_host_header(server: str) -> None:
    out = await fetch(f"{server}/plain", ALLOWED)
    assert not out.is_error and "just text" in out.text
    assert f"host={server.removeprefix('http://')}" in out.text


async def test_non_text_http_errors_and_size_limit(server: str) -> None:
    img = await fetch(f"{server}/image", ALLOWED)
    assert img.is_error and "image/png" in img.text
    missing = await fetch(f"{server}/missing", ALLOWED)
    assert missing.is_error and "404" in missing.text
    small = FetchUrlConfig(allow_hosts=["127.0.0.1"], max_bytes=1000)
    big = await fetch(f"{server}/big", small)
    assert not big.is_error and "only the start was read" in big.text and big.text.count("z") == 1000


async def test_redirects_are_followed_and_bounded(server: str) -> None:
    ok = await fetch(f"{server}/redirect?to=/plain", ALLOWED)
    assert not ok.is_error and "just text" in ok.text
    loop = await fetch(f"{server}/loop", FetchUrlConfig(allow_hosts=["127.0.0.1"], max_redirects=3))
    assert loop.is_error and "Too many redirects" in loop.text


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "http://10.1.2.3/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
    ],
)
async def test_internal_addresses_are_refused_without_traffic(url: str) -> None:
    out = await fetch(url, FetchUrlConfig(), transport=NoNetwork())
    assert out.is_error and "non-public address" in out.text


async def test_names_resolving_to_internal_addresses_are_refused() -> None:
    resolver = fake_resolver({"intranet.example": ["10.0.0.5"], "mixed.example": ["93.184.215.14", "192.168.1.1"]})
    for host in ("intranet.example", "mixed.example"):
        out = await fetch(f"https://{host}/", FetchUrlConfig(), resolver=resolver, transport=NoNetwork())
        assert out.is_error and "non-public" in out.text
    out = await fetch("http://localhost:9/", FetchUrlConfig(), transport=NoNetwork())
    assert out.is_error and "non-public" in out.text


async def test_redirect_to_an_internal_address_is_refused(server: str) -> None:
    for target in ("http://10.0.0.1/admin", "http://169.254.169.254/", "http://localhost/"):
        out = await fetch(f"{server}/redirect?to={target}", ALLOWED)
        assert out.is_error and "non-public" in out.text, target


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("file:///etc/passwd", "Only http and https"),
        ("ftp://example.com/", "Only http and https"),
        ("http://user:pw@example.com/", "credentials"),
        ("http:///nohost", "no host"),
        ("http://example.com:99999/", "valid URL"),
    ],
)
async def test_bad_urls_are_refused(url: str, problem: str) -> None:
    out = await fetch(url, FetchUrlConfig(), transport=NoNetwork())
    assert out.is_error and problem in out.text


def test_public_address_rules() -> None:
    public = ["93.184.215.14", "2606:4700:4700::1111", "8.8.8.8"]
    internal = ["127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.0.1", "169.254.1.1", "::1", "fe80::1",
                "fc00::1", "::ffff:10.0.0.1", "0.0.0.0", "240.0.0.1", "100.64.1.1", "ff02::1", "255.255.255.255"]
    assert all(address_is_public(ipaddress.ip_address(a)) for a in public)
    assert not any(address_is_public(ipaddress.ip_address(a)) for a in internal)


def test_allow_hosts_lets_a_listed_host_through_only() -> None:
    t = parse_target("http://127.0.0.1:8080/x")
    assert choose_address(t, ["127.0.0.1"], ["127.0.0.1"]) == "127.0.0.1"
    with pytest.raises(FetchRefused):
        choose_address(parse_target("http://localhost:8080/"), ["127.0.0.1"], ["127.0.0.1"])
    with pytest.raises(FetchRefused):
        choose_address(t, [], ["127.0.0.1"])


def test_content_kinds_and_html_text() -> None:
    assert content_kind("text/html; charset=utf-8") == "html"
    assert content_kind("application/json") == "text" and content_kind("application/vnd.api+json") == "text"
    assert content_kind("application/octet-stream") is None and content_kind("image/png") is None
    title, text = html_to_text("<title>T</title><p>a<br>b</p><script>x</script>")
    assert title == "T" and text == "a\nb"


def test_fetch_url_needs_approval_by_default() -> None:
    from gelbridge._tools import builtin_tools

    tools = {t.name: t for t in builtin_tools({})}
    assert tools["fetch_url"].approval == "always" and tools["current_time"].approval == "never"
    relaxed = {t.name: t for t in builtin_tools({"fetch_url": {"approval": "never"}, "current_time": {"enabled": False}})}
    assert relaxed["fetch_url"].approval == "never" and "current_time" not in relaxed
