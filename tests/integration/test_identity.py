"""Login by handle or DID alone (``[account] identifier``, no ``pds``), on the real local
PDS and its PLC: a DID is looked up in the PLC, a handle through a resolveHandle service,
and the DID document gives the PDS; a handle whose DID document does not name it back is
refused before any password is sent; ``gelbridge check`` says where it resolved to."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._identity import IdentityError, resolve_account
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring
from testkit.loopback_http import serving

from .conftest import PASSWORD_ENV, App, make_settings, running_worker, text_of
from .test_check import gelbridge

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


def no_pds(settings: Settings, identifier: str, **identity: str) -> Settings:
    return settings.model_copy(update={
        "account": settings.account.model_copy(update={"pds": None, "identifier": identifier}),
        "identity": settings.identity.model_copy(update=identity),
    })


async def test_a_did_alone_finds_its_pds_through_the_plc_and_the_worker_answers(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    base = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)
    settings = no_pds(base, pds_account.did, plc_url=dev_pds.plc_url)
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        assert worker.pds.pds_url == dev_pds.pds_url.rstrip("/") and worker.did == pds_account.did
        model_server.enqueue(Turn(text="found you"))
        k = await app.send("where are you?", conversation=new_tid())
        _rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
        saved = await worker.store.load_session(f"|{pds_account.did}")
    assert text_of(content) == "found you"
    assert saved is not None and saved["pds"] == dev_pds.pds_url.rstrip("/")  # `gelbridge status` shows it


async def test_a_handle_alone_resolves_through_a_resolve_handle_service(
    dev_pds: DevPds, pds_account: AccountInfo,
) -> None:
    cfg = Settings().identity.model_copy(update={"plc_url": dev_pds.plc_url, "handle_resolver": dev_pds.pds_url})
    got = await resolve_account(pds_account.handle.upper(), cfg)  # handles are case-insensitive
    assert (got.did, got.handle, got.pds) == (pds_account.did, pds_account.handle, dev_pds.pds_url.rstrip("/"))
    with pytest.raises(IdentityError, match="does not know the handle"):
        await resolve_account(f"nobody{secrets.token_hex(4)}.test", cfg)
    with pytest.raises(IdentityError, match="no DID document"):
        await resolve_account("did:plc:" + "a" * 24, cfg)


@pytest.fixture
def lying_resolver(dev_pds: DevPds) -> Iterator[tuple[str, AccountInfo]]:
    """A resolveHandle service that answers every handle with another account's DID."""
    other = create_account(dev_pds.pds_url, f"lie{secrets.token_hex(4)}.test", secrets.token_urlsafe(12))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"did": other.did}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None: ...

    with serving(Handler) as url:
        yield url, other


async def test_a_handle_its_did_document_does_not_name_is_refused_and_check_says_so(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], model_server: ModelServer,
    tmp_path: Path, lying_resolver: tuple[str, AccountInfo],
) -> None:
    url, other = lying_resolver
    cfg = Settings().identity.model_copy(update={"plc_url": dev_pds.plc_url, "handle_resolver": url})
    with pytest.raises(IdentityError, match="does not name this handle"):
        await resolve_account(pds_account.handle, cfg)

    from .worker_proc import write_config

    configs = {}
    for name, resolver in (("good", dev_pds.pds_url), ("bad", url)):
        (tmp_path / name).mkdir()
        path = configs[name] = write_config(tmp_path / name, dev_pds.pds_url, pds_account, model_server.url,
                                            keyring[0])
        text = path.read_text().replace(f'pds = "{dev_pds.pds_url}"\n', "")
        path.write_text(text + f'\n[identity]\nplc_url = "{dev_pds.plc_url}"\nhandle_resolver = "{resolver}"\n')
    env = {PASSWORD_ENV: pds_account.app_password}
    good, bad = configs["good"], configs["bad"]
    ok = await asyncio.to_thread(gelbridge, "check", "--config", str(good), cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    assert f"{dev_pds.pds_url.rstrip('/')} (resolved from the identifier) logged in as {pds_account.handle}" in ok.stdout
    for command in ("check", "run"):
        r = await asyncio.to_thread(gelbridge, command, "--config", str(bad), cwd=tmp_path, env=env)
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert f"cannot find the PDS of {pds_account.handle}" in r.stderr and "not verified" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "ready" not in r.stdout
