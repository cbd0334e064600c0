"""Built-in ``fetch_url``: GET a web page and return readable text.

It reaches the network on the user's behalf, so it is guarded:

- http and https only, no credentials in the URL;
- the host is resolved first and every address must be public: private, loopback,
  link-local, multicast, reserved, unspecified and shared (CGNAT) addresses are
  refused unless ``[tools.fetch_url] allow_hosts`` lists the host as written in the URL;
- the connection goes to the address that was checked (no second DNS lookup, so DNS
  rebinding cannot swap in an internal address); TLS still verifies the host name;
- redirects are followed by hand, at most ``max_redirects``, each target checked again;
- the body is read up to ``max_bytes``; only text-like content types are accepted;
- the whole fetch is bounded by ``timeout``.
HTML becomes text with the stdlib ``html.parser``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from gelbridge._tools.config import FetchUrlConfig
from gelbridge._tools.registry import Tool, ToolOutput

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gelbridge.tools.fetch_url")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"url": {"type": "string", "description": "The http or https URL to fetch."}},
    "required": ["url"],
    "additionalProperties": False,
}

_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class FetchRefused(Exception):
    """The URL may not be fetched; the message explains why (goes to the model)."""


# --- pure checks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower-case, without brackets
    port: int
    url: str


def parse_target(url: str) -> Target:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise FetchRefused(f"Not a valid URL: {e}.") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchRefused("Only http and https URLs can be fetched.")
    if parts.username is not None or parts.password is not None:
        raise FetchRefused("URLs with credentials (user:password@) are not fetched.")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise FetchRefused("The URL has no host.")
    return Target(scheme, host, port or (443 if scheme == "https" else 80), url.strip())


def address_is_public(ip: IPAddress) -> bool:
    """True only for globally routable unicast addresses."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return False
    return ip.is_global and not (
        ip.is_multicast or ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_unspecified
    )


def host_is_allowed(host: str, allow_hosts: list[str]) -> bool:
    wanted = host.lower().strip("[]").rstrip(".")
    return any(wanted == h.lower().strip("[]").rstrip(".") for h in allow_hosts)


def choose_address(target: Target, addresses: list[str], allow_hosts: list[str]) -> str:
    """The address to connect to, or ``FetchRefused``. Every resolved address must be
    public (an attacker's DNS could mix one internal address into the answer)."""
    if not addresses:
        raise FetchRefused(f"The host {target.host} could not be resolved.")
    ips = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
    if not host_is_allowed(target.host, allow_hosts):
        bad = [str(ip) for ip in ips if not address_is_public(ip)]
        if bad:
            raise FetchRefused(
                f"Refused: {target.host} resolves to a non-public address ({bad[0]}); "
                "internal networks cannot be fetched."
            )
    return str(ips[0])


# --- HTML to text --------------------------------------------------------------------------

_SKIP = {"script", "style", "noscript", "template", "svg", "head", "iframe", "object"}
_BLOCK = {
    "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer",
    "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "hr", "main", "nav", "aside", "dd", "dt",
    "figure", "figcaption", "form",
}


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self.title: list[str] = []
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIP:
            self._skip += 1
        elif tag in _BLOCK:
            self.chunks.append("\n")
        if tag == "li":
            self.chunks.append("- ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:
            self.chunks.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK:
            self.chunks.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skip:
            self.chunks.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """``(title, text)`` of an HTML document: scripts and styles dropped, block
    elements on their own lines, runs of whitespace collapsed."""
    p = _TextExtractor()
    try:
        p.feed(html)
        p.close()
    except Exception:  # html.parser is lenient; keep whatever was read
        pass
    lines = [re.sub(r"[ \t\r\f\v\u00a0]+", " ", ln).strip() for ln in "".join(p.chunks).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    title = re.sub(r"\s+", " ", "".join(p.title)).strip()
    return title, text


_TEXT_TYPES = {"application/json", "application/xml", "application/xhtml+xml", "application/rss+xml",
               "application/atom+xml", "application/javascript", "application/ld+json"}


def content_kind(content_type: str) -> str | None:
    """``"html"``, ``"text"`` or None (refused) for a Content-Type header."""
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime in ("text/html", "application/xhtml+xml"):
        return "html"
    if mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith("+json") or mime.endswith("+xml"):
        return "text"
    if not mime:
        return "text"
    return None


def charset_of(content_type: str) -> str:
    m = re.search(r"charset=[\"']?([A-Za-z0-9._-]+)", content_type)
    return m.group(1) if m else "utf-8"


# --- I/O ---------------------------------------------------------------------------------------


async def system_resolver(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in seen:
            seen.append(addr)
    return seen


def _pinned_url(target: Target, address: str) -> str:
    parts = urlsplit(target.url)
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{target.port}"
    return urlunsplit((target.scheme, netloc, parts.path or "/", parts.query, ""))


def _host_header(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


async def fetch(
    url: str,
    config: FetchUrlConfig,
    *,
    resolver: Resolver = system_resolver,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ToolOutput:
    """Fetch ``url`` under the rules in the module docstring. Refusals and HTTP
    failures come back as error outputs."""
    import httpx  # here: registering the tool (every turn, offline too) needs no HTTP stack

    try:
        return await asyncio.wait_for(_fetch(url, config, resolver, transport), timeout=config.timeout)
    except FetchRefused as e:
        return ToolOutput(str(e), True)
    except TimeoutError:
        return ToolOutput(f"The page did not load within {config.timeout:g} seconds.", True)
    except httpx.HTTPError as e:
        return ToolOutput(f"The page could not be fetched: {type(e).__name__}.", True)


async def _fetch(
    url: str, config: FetchUrlConfig, resolver: Resolver, transport: httpx.AsyncBaseTransport | None
) -> ToolOutput:
    import httpx

    async with httpx.AsyncClient(
        follow_redirects=False, trust_env=False, timeout=config.timeout, transport=transport
    ) as client:
        current = url
        for _hop in range(config.max_redirects + 1):
            target = parse_target(current)
            address = choose_address(target, await resolver(target.host, target.port), config.allow_hosts)
            request = client.build_request(
                "GET",
                _pinned_url(target, address),
                headers={
                    "Host": _host_header(target),
                    "User-Agent": config.user_agent,
                    "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
                    # No compression: the size limit then bounds memory (no zip bombs).
                    "Accept-Encoding": "identity",
                },
                extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
            )
            response = await client.send(request, stream=True)
            try:
                if response.status_code in (301, 302, 303, 307, 308):
                    location = response.headers.get("location")
                    if not location:
                        raise FetchRefused(f"HTTP {response.status_code} redirect without a Location.")
                    current = urljoin(target.url, location)
                    continue
                return await _read_page(response, target, config)
            finally:
                await response.aclose()
        raise FetchRefused(f"Too many redirects (more than {config.max_redirects}).")


async def _read_page(response: httpx.Response, target: Target, config: FetchUrlConfig) -> ToolOutput:
    if response.status_code >= 400:
        return ToolOutput(f"HTTP {response.status_code} from {target.url}.", True)
    content_type = response.headers.get("content-type", "")
    kind = content_kind(content_type)
    if kind is None:
        return ToolOutput(
            f"Not a text page (content type {content_type.split(';')[0].strip()}); only text and HTML are read.",
            True,
        )
    body = bytearray()
    truncated = False
    async for chunk in response.aiter_bytes():
        body.extend(chunk)
        if len(body) > config.max_bytes:
            del body[config.max_bytes:]
            truncated = True
            break
    try:
        raw = body.decode(charset_of(content_type), errors="replace")
    except LookupError:
        raw = body.decode("utf-8", errors="replace")
    title, text = html_to_text(raw) if kind == "html" else ("", raw)
    head = [f"URL: {target.url}", f"Status: {response.status_code}"]
    if title:
        head.append(f"Title: {title}")
    if truncated:
        head.append(f"Note: the page is larger than {config.max_bytes} bytes; only the start was read.")
    return ToolOutput("\n".join(head) + "\n\n" + text)


def make_fetch_url(
    config: FetchUrlConfig, *, resolver: Resolver = system_resolver, transport: httpx.AsyncBaseTransport | None = None
) -> Tool:
    async def run(args: dict[str, Any]) -> ToolOutput:
        return await fetch(str(args["url"]), config, resolver=resolver, transport=transport)

    return Tool(
        name="fetch_url",
        description=(
            "Fetch a public web page (http/https) and return its readable text. "
            "Internal network addresses are refused."
        ),
        parameters=PARAMETERS,
        executor=run,
        approval=config.approval,
    )


__all__ = [
    "FetchRefused",
    "address_is_public",
    "choose_address",
    "content_kind",
    "fetch",
    "html_to_text",
    "make_fetch_url",
    "parse_target",
]
