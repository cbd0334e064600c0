"""One process, three accounts, one MCP server configured: the two accounts that share
their configuration share one server process (and one model client); the third, whose
``[[accounts]]`` entry has its own ``[accounts.mcp.servers.t]``, gets its own. Every
account is answered, with the results of its own tool calls (real local PDS, the real
stdio test MCP server, the local model in tool mode)."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import sys
from pathlib import Path

import pytest

from gelbridge._bridge import Bridge
from gelbridge._config import Settings
from gelbridge._dev._tool_mode import Mode
from gelbridge._dev.model_server import ModelServer, responder
from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._pds import PdsClient
from gelbridge._records import TextPart, ToolResultPart, new_tid
from gelbridge._sealing import Keyring

from .conftest import App

pytestmark = [pytest.mark.pds, pytest.mark.timeout(240)]

SERVER = str(Path(__file__).parents[1] / "tools" / "mcp_test_server.py")


def mcp_children() -> list[int]:
    """The test MCP server processes this process started (its children, from /proc)."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == me and fields[0] != "Z" and SERVER.encode() in cmdline:
            out.append(int(entry.name))
    return sorted(out)


async def wait_children(n: int, timeout: float = 20.0) -> list[int]:
    for _ in range(int(timeout / 0.1)):
        got = mcp_children()
        if len(got) == n:
            return got
        await asyncio.sleep(0.1)
    return mcp_children()


async def test_accounts_that_share_a_config_share_one_mcp_server(dev_pds: DevPds, tmp_path: Path) -> None:
    accts: list[tuple[str, AccountInfo]] = [
        (name, create_account(dev_pds.pds_url, f"sh{name}{secrets.token_hex(4)}.test", secrets.token_urlsafe(12)))
        for name in ("a", "b", "c")]
    keyrings = {name: Keyring() for name, _ in accts}
    kids = {name: kr.add_new(f"k-{name}") for name, kr in keyrings.items()}
    environ = {f"PW_{name.upper()}": a.app_password for name, a in accts}
    server = {"command": [sys.executable, SERVER], "approval": "never", "env": {"WHO": "everyone"}}
    with ModelServer(responder=responder(Mode.TOOLS)) as model:
        settings = Settings.model_validate({
            "state": {"dir": str(tmp_path / "state")},
            "accounts": [
                {"name": name, "pds": dev_pds.pds_url, "identifier": a.handle, "password_env": f"PW_{name.upper()}",
                 **({"mcp": {"servers": {"t": {**server, "env": {"WHO": "c alone"}}}}} if name == "c" else {})}
                for name, a in accts],
            "defaults": {"model": {"provider": "local", "id": "echo-1"},
                         "tools": ["mcp_t_echo", "mcp_t_pid", "mcp_t_env"]},
            "providers": {"local": {"adapter": "openai", "base_url": model.url + "/v1", "max_retries": 0}},
            "mcp": {"servers": {"t": server}},
            "replies": {"update_interval": 0.2},
            "worker": {"shutdown_grace": 2.0},
        })
        assert mcp_children() == []
        bridge = Bridge(settings, environ=environ, keyrings=keyrings)
        stop, ready, out = asyncio.Event(), asyncio.Event(), io.StringIO()
        run = asyncio.create_task(bridge.run(stop, ready=ready, out=out))
        try:
            await asyncio.wait_for(ready.wait(), 120)
            children = mcp_children()
            assert len(children) == 2, children  # a and b share one; c has its own
            workers = {ctx.label: ctx.worker for ctx in bridge.accounts.values()}
            assert workers["a"].registry is workers["b"].registry is not workers["c"].registry
            assert workers["a"].model is workers["b"].model is workers["c"].model  # one config of providers
            assert workers["a"].keyring is not workers["b"].keyring and workers["a"].deps is not workers["b"].deps
            assert out.getvalue().count("  adapters   anthropic, ") == 3  # named from the shared client

            async def ask(name: str, account: AccountInfo) -> dict[str, str]:
                async with PdsClient(dev_pds.pds_url) as pds:
                    await pds.login(account.handle, account.password)
                    app = App(pds, keyrings[name], kids[name])
                    secret = f"only-for-{name}-{secrets.token_hex(4)}"
                    rkey = await app.send(f"call mcp_t_echo text={secret} and call mcp_t_pid and call mcp_t_env WHO",
                                          conversation=new_tid())
                    rec, content = await app.wait_status(f"{rkey}.r0", {"complete", "error"}, timeout=90)
                    assert rec.status == "complete" and content is not None
                    results = [p for p in content.parts if isinstance(p, ToolResultPart)]
                    text = "".join(p.text for p in content.parts if isinstance(p, TextPart))
                    assert len(results) == 3 and not any(r.is_error for r in results), results
                    assert secret in text
                    return {"secret": secret, "echo": results[0].output, "pid": results[1].output,
                            "env": results[2].output}

            got = dict(zip("abc", await asyncio.gather(*(ask(n, a) for n, a in accts))))
            for name in "abc":
                assert got[name]["echo"] == got[name]["secret"]  # each its own result
            assert got["a"]["pid"] == got["b"]["pid"] != got["c"]["pid"]
            assert {int(got[n]["pid"]) for n in "abc"} == set(children)
            assert [got[n]["env"] for n in "abc"] == ["everyone", "everyone", "c alone"]
        finally:
            stop.set()
            await asyncio.wait_for(run, 60)
        assert await wait_children(0) == []  # the pool was closed with the bridge
