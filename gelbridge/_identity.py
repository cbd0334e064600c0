"""Where an account lives: its handle or DID resolved to its PDS, so ``[account]
identifier`` alone is enough (``pds`` stays as an override, and skips all of this).

- A handle becomes a DID through DNS (``_atproto.<handle>`` TXT), then
  ``https://<handle>/.well-known/atproto-did`` (the ``atproto`` SDK's handle resolver), or,
  when ``[identity] handle_resolver`` names a service, through its
  ``com.atproto.identity.resolveHandle`` (an AppView or your own PDS; trusted as much as
  the DNS).
- The DID document (``did:plc`` from ``[identity] plc_url``, ``did:web`` from the web,
  the SDK's DID resolver) gives the PDS endpoint. For a handle, the document must name
  it back (``alsoKnownAs``): a handle that points at a DID which does not claim it is
  refused, so an app password is only ever sent to the PDS the account itself declares.
- After the login, the worker checks that the session's DID is the resolved one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from gelbridge._config import IdentityConfig, is_loopback_host
from gelbridge._errors import ConfigError

log = logging.getLogger("gelbridge.identity")


class IdentityError(ConfigError):
    """An account's handle or DID could not be resolved to a PDS."""


@dataclass(frozen=True)
class Resolved:
    did: str
    handle: str | None
    pds: str


def _fail(identifier: str, why: str) -> IdentityError:
    return IdentityError(f"cannot find the PDS of {identifier}: {why}; check the identifier, or set "
                         "[account] pds = \"https://...\" to skip the lookup")


async def resolve_account(identifier: str, cfg: IdentityConfig) -> Resolved:
    """The DID, handle and PDS URL of ``identifier`` (a handle or a DID)."""
    from atproto_identity.did.resolver import AsyncDidResolver

    ident = identifier.strip()
    if ident.startswith("at://"):
        ident = ident[5:]
    handle = None if ident.startswith("did:") else ident.lower().lstrip("@")
    did = ident if handle is None else await _handle_to_did(handle, cfg)
    if not did.startswith(("did:plc:", "did:web:")):
        raise _fail(identifier, f"{did!r} is not a did:plc or did:web")
    try:
        doc = await AsyncDidResolver(plc_url=cfg.plc_url, timeout=cfg.timeout).resolve(did)
    except Exception as e:  # noqa: BLE001 - the SDK raises httpx, pydantic and its own errors
        raise _fail(identifier, f"its DID document could not be read ({type(e).__name__})") from None
    if doc is None:
        raise _fail(identifier, f"no DID document for {did} at {cfg.plc_url if did.startswith('did:plc:') else 'its web host'}")
    named = (doc.get_handle() or "").lower()
    if handle is not None and named != handle:
        raise _fail(identifier, f"the DID document of {did} does not name this handle (it names "
                                f"{named or 'none'}): the handle is not verified")
    pds = doc.get_pds_endpoint()
    if not pds:
        raise _fail(identifier, f"the DID document of {did} names no PDS (#atproto_pds service)")
    parts = urlsplit(pds)
    if parts.scheme != "https" and not (parts.scheme == "http" and is_loopback_host(parts.hostname)):
        raise _fail(identifier, f"the DID document of {did} names a PDS that is not https ({pds}): the app "
                                "password would travel in clear")
    log.info("resolved %s to %s on %s", identifier, did, pds)
    return Resolved(did=did, handle=named or handle, pds=pds.rstrip("/"))


async def _handle_to_did(handle: str, cfg: IdentityConfig) -> str:
    if cfg.handle_resolver:
        import httpx

        url = cfg.handle_resolver.rstrip("/") + "/xrpc/com.atproto.identity.resolveHandle"
        try:
            async with httpx.AsyncClient(timeout=cfg.timeout) as http:
                resp = await http.get(url, params={"handle": handle})
        except httpx.HTTPError as e:
            raise _fail(handle, f"{cfg.handle_resolver} does not answer ({type(e).__name__})") from None
        try:
            body = resp.json() if resp.status_code == 200 else None
        except ValueError:
            body = None
        did = body.get("did") if isinstance(body, dict) else None
        if not isinstance(did, str):
            raise _fail(handle, f"{cfg.handle_resolver} does not know the handle (HTTP {resp.status_code})")
        return did
    from atproto_identity.handle.resolver import AsyncHandleResolver

    try:
        found = await AsyncHandleResolver(timeout=cfg.timeout).resolve(handle)
    except Exception as e:  # noqa: BLE001
        raise _fail(handle, f"the handle lookup failed ({type(e).__name__})") from None
    if not isinstance(found, str) or not found:
        raise _fail(handle, "no _atproto DNS record and no /.well-known/atproto-did for the handle")
    return found


async def pds_url_of(pds: str | None, identifier: str, cfg: IdentityConfig) -> tuple[str, str | None]:
    """``(PDS URL, the DID the session must have)``: ``pds`` when the config sets it (no
    DID to expect), else the resolved PDS and DID of ``identifier``."""
    if pds:
        return pds, None
    resolved = await resolve_account(identifier, cfg)
    return resolved.pds, resolved.did


def check_session_did(session_did: str, expected: str | None, identifier: str, pds_url: str) -> None:
    """After a login on a resolved PDS: the session must be the account the DID document
    is about, or nothing is served (or sent) as it."""
    if expected is not None and session_did != expected:
        raise IdentityError(f"the PDS at {pds_url} logged {identifier} in as {session_did}, not {expected} "
                            "as its DID document says; not using it")
