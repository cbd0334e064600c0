"""SharedClients: one model client and one set of MCP servers per process, by settings key.

The MCP tests start the real test server (tests/tools/mcp_test_server.py) over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gelbridge._config import Settings
from gelbridge._errors import ConfigError
from gelbridge._runtime.shared import SharedClients, model_key, tools_plan
from gelbridge._sealing import Keyring
from gelbridge._state import open_state
from gelbridge._tools import ToolCall, ToolRegistry, execute_journaled

SERVER = str(Path(__file__).parents[1] / "tools" / "mcp_test_server.py")
PROVIDERS = {"local": {"adapter": "openai", "base_url": "http://127.0.0.1:9/v1", "max_retries": 0}}


def server_table(**over: Any) -> dict[str, Any]:
    return {"command": [sys.executable, SERVER], "approval": "never", **over}


def config(tmp_path: Path, *, accounts: list[dict[str, Any]] | None = None, **over: Any) -> Settings:
    data: dict[str, Any] = {"state": {"dir": str(tmp_path / "state")}, "providers": PROVIDERS,
                            "accounts": accounts or [{"identifier": "a.test"}, {"identifier": "b.test"}]}
    data.update(over)
    return Settings.model_validate(data)


def narrowed(settings: Settings) -> list[Settings]:
    return [settings.for_account(e) for e in settings.accounts_list()]


async def server_pid(registry: ToolRegistry, server: str = "t") -> int:
    tool = registry.get(f"mcp_{server}_pid")
    assert tool is not None
    out = await tool.executor({})
    assert not out.is_error, out.text
    return int(out.text)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


async def gone(pid: int, timeout: float = 10.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[SharedClients]:
    with open(tmp_path / "mcp-stderr.log", "w") as errlog:
        p = SharedClients(errlog=errlog)
        try:
            yield p
        finally:
            await asyncio.wait_for(p.aclose(), 30)


# --- model clients -------------------------------------------------------------------------------


async def test_accounts_of_one_config_share_one_model_client(pool: SharedClients, tmp_path: Path) -> None:
    a, b = narrowed(config(tmp_path))
    ma, mb = await pool.model_for(a), await pool.model_for(b)
    assert ma is mb and pool.users(ma) == 2 and pool.counts()["models"] == 1
    # it was built from the key's settings only: nothing of either account is in it
    assert ma.settings.account.identifier is None and ma.settings.keyring.path is None
    assert ma.settings.providers == a.providers and ma.settings.adapters == a.adapters
    assert "openai" in ma.registry.names()


async def test_a_different_key_gets_its_own_model_client(pool: SharedClients, tmp_path: Path) -> None:
    base = config(tmp_path)
    other_adapters = base.model_copy(update={"adapters": base.adapters.model_copy(update={"pool_size": 2})})
    other_bound = base.model_copy(update={"thread": base.thread.model_copy(update={"max_request_bytes": 1 << 20})})
    other_provider = base.model_copy(update={"providers": {
        "local": base.providers["local"].model_copy(update={"base_url": "http://127.0.0.1:10/v1"})}})
    unread = base.model_copy(update={"thread": base.thread.model_copy(update={"max_depth": 9}),
                                     "worker": base.worker.model_copy(update={"concurrency": 1})})
    clients = [await pool.model_for(s) for s in (base, other_adapters, other_bound, other_provider, unread)]
    assert len({id(c) for c in clients}) == 4
    assert clients[-1] is clients[0]  # what the client does not read is not in its key
    assert clients[1].registry is not clients[0].registry


def test_the_model_key_holds_the_api_keys_the_providers_read(tmp_path: Path) -> None:
    s = config(tmp_path, providers={"p": {**PROVIDERS["local"], "api_key_env": "K"}})
    assert model_key(s, {"K": "one"}) == model_key(s, {"K": "one", "OTHER": "x"})
    assert model_key(s, {"K": "one"}) != model_key(s, {"K": "two"})
    assert "one" not in model_key(s, {"K": "one"})  # a hash: no secret kept in the key


async def test_the_last_release_closes_the_model_client(pool: SharedClients, tmp_path: Path) -> None:
    a, b = narrowed(config(tmp_path))
    ma, mb = await pool.model_for(a), await pool.model_for(b)
    await pool.release(ma)
    assert not ma._closed and pool.users(ma) == 1
    await pool.release(mb)
    assert ma._closed and pool.counts()["models"] == 0
    await pool.release(ma)  # released already: nothing happens
    again = await pool.model_for(a)
    assert again is not ma and not again._closed


async def test_concurrent_first_use_starts_one_model_client(pool: SharedClients, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = SharedClients._new_model

    async def slow(self: SharedClients, settings: Settings) -> Any:
        await asyncio.sleep(0.2)  # callers arrive while it starts
        client = await real(self, settings)
        made.append(client)
        return client

    monkeypatch.setattr(SharedClients, "_new_model", slow)
    got = await asyncio.gather(*(pool.model_for(s) for s in narrowed(config(tmp_path)) * 5))
    assert len(made) == 1 and all(c is made[0] for c in got) and pool.users(made[0]) == 10


async def test_a_failed_start_is_not_kept(pool: SharedClients, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[int] = []
    real = SharedClients._new_model

    async def flaky(self: SharedClients, settings: Settings) -> Any:
        tries.append(1)
        await asyncio.sleep(0.05)
        if len(tries) == 1:
            raise ConfigError("the adapters did not load")
        return await real(self, settings)

    monkeypatch.setattr(SharedClients, "_new_model", flaky)
    a, b = narrowed(config(tmp_path))
    first = await asyncio.gather(pool.model_for(a), pool.model_for(b), return_exceptions=True)
    assert [type(r) for r in first] == [ConfigError, ConfigError]  # both waited for the one start
    assert pool.counts()["models"] == 0
    client = await pool.model_for(a)  # started again, not the failure
    assert len(tries) == 2 and not client._closed and pool.users(client) == 1


async def test_a_caller_cancelled_during_the_start(pool: SharedClients, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    real = SharedClients._new_model
    made: list[Any] = []

    async def slow(self: SharedClients, settings: Settings) -> Any:
        await asyncio.sleep(0.3)
        made.append(await real(self, settings))
        return made[-1]

    monkeypatch.setattr(SharedClients, "_new_model", slow)
    a, b = narrowed(config(tmp_path))
    first = asyncio.ensure_future(pool.model_for(a))
    second = asyncio.ensure_future(pool.model_for(b))
    await asyncio.sleep(0.05)
    first.cancel()
    client = await second  # the other caller still gets it
    assert first.cancelled() and pool.users(client) == 1 and not client._closed
    await pool.release(client)
    # the only caller gives up: once started, the client is closed, not left behind
    alone = asyncio.ensure_future(pool.model_for(a))
    await asyncio.sleep(0.05)
    alone.cancel()
    for _ in range(100):
        if len(made) == 2 and made[1]._closed:
            break
        await asyncio.sleep(0.02)
    assert len(made) == 2 and made[1]._closed and pool.counts()["models"] == 0


async def test_without_sharing_every_caller_gets_its_own(tmp_path: Path) -> None:
    pool = SharedClients(share=False)
    a, b = narrowed(config(tmp_path))
    ma, mb = await pool.model_for(a), await pool.model_for(b)
    ra, rb = await pool.tools_for(a), await pool.tools_for(b)
    assert ma is not mb and ra is not rb and pool.counts() == {"models": 2, "registries": 2, "mcp_servers": 0}
    await pool.release(ma)
    assert ma._closed and not mb._closed
    await pool.aclose()
    assert mb._closed


async def test_close_closes_everything_and_ends_the_pool(tmp_path: Path) -> None:
    pool = SharedClients()
    a, _ = narrowed(config(tmp_path))
    client = await pool.model_for(a)
    await pool.aclose()
    assert client._closed and pool.counts() == {"models": 0, "registries": 0, "mcp_servers": 0}
    with pytest.raises(RuntimeError, match="closed"):
        await pool.model_for(a)
    await pool.release(client)  # after the close: nothing to do


# --- tools and MCP servers -----------------------------------------------------------------------


def test_the_tools_key(tmp_path: Path) -> None:
    env = {"PASS": "1"}
    base = config(tmp_path, mcp={"servers": {"t": server_table(env_passthrough=["PASS"])}})
    key = tools_plan(base, env).key
    assert key is not None and key == tools_plan(base.model_copy(update={"defaults": base.defaults.model_copy(
        update={"tools": ["x"]})}), env).key  # [defaults] is read per turn, not by the registry
    assert tools_plan(base, {"PASS": "2"}).key != key  # the environment the server gets
    assert tools_plan(base.model_copy(update={"tools": {"call_timeout": 5}}), env).key != key
    assert tools_plan(base.model_copy(update={"tools": {"fetch_url": {"approval": "never"}}}), env).key != key
    assert tools_plan(base.model_copy(update={"tools": {"max_steps": 3}}), env).key == key  # not the registry's
    own = base.model_copy(update={"mcp": {"servers": {"t": server_table(share="account")}}})
    assert tools_plan(own, env).key is None and tools_plan(own, env).servers[0].key is None
    off = base.model_copy(update={"mcp": {"servers": {"t": server_table(enabled=False)}}})
    assert tools_plan(off, env).servers == []
    with pytest.raises(ConfigError):
        tools_plan(base.model_copy(update={"tools": {"nope": {}}}), env)


async def test_accounts_share_one_mcp_server_and_each_gets_its_own_results(pool: SharedClients,
                                                                          tmp_path: Path) -> None:
    """Two accounts on one server process, calling it at once through their own journals
    (one state store, the same conversation and call ids): every result is the caller's."""
    settings = config(tmp_path, mcp={"servers": {"t": server_table()}})
    a, b = narrowed(settings)
    ra, rb = await pool.tools_for(a), await pool.tools_for(b)
    assert ra is rb and pool.counts()["mcp_servers"] == 1
    pid = await server_pid(ra)
    store = await open_state(settings)
    kr = Keyring()
    kid = kr.add_new("k")

    def seal(data: bytes) -> tuple[bytes, str]:
        return data[::-1], kid  # reversible stand-in: the journal stores what seal returns

    def open_(data: bytes, key_id: str) -> bytes:
        assert key_id == kid
        return data[::-1]

    async def account(who: str) -> list[str]:
        calls = [ToolCall(f"call_{i}", "mcp_t_echo", json.dumps({"text": f"{who}-{i}"}), approved=True)
                 for i in range(12)]
        outs = await execute_journaled(calls, ra if who == "a" else rb, store, account=f"did:plc:{who}",
                                       conversation="3conv", reply_rkey="3reply.r0", seal=seal, open_=open_,
                                       timeout=20, max_output_chars=1000)
        return [o.output for o in outs]

    try:
        got_a, got_b = await asyncio.gather(account("a"), account("b"))
        assert got_a == [f"a-{i}" for i in range(12)] and got_b == [f"b-{i}" for i in range(12)]
        again_b = await account("b")  # journaled: the stored results, still B's own
        assert again_b == got_b
    finally:
        await store.aclose()
    assert await server_pid(rb) == pid  # one process served both


async def test_an_accounts_own_mcp_settings_get_their_own_server(pool: SharedClients, tmp_path: Path) -> None:
    settings = config(tmp_path, mcp={"servers": {"t": server_table(), "u": server_table()}}, accounts=[
        {"identifier": "a.test"}, {"identifier": "b.test"},
        {"identifier": "c.test", "mcp": {"servers": {"t": server_table(env={"WHO": "c"})}}},
    ])
    a, b, c = narrowed(settings)
    ra, rb, rc = await pool.tools_for(a), await pool.tools_for(b), await pool.tools_for(c)
    assert ra is rb and rc is not ra
    assert pool.counts() == {"models": 0, "registries": 2, "mcp_servers": 3}  # t, u, and c's own t
    assert await server_pid(ra) == await server_pid(rb) != await server_pid(rc)
    assert await server_pid(ra, "u") == await server_pid(rc, "u")  # what c did not change it shares
    env_c = rc.get("mcp_t_env")
    assert env_c is not None and (await env_c.executor({"name": "WHO"})).text == "c"
    assert sorted(ra.names()) == sorted(rc.names())


async def test_the_last_account_leaving_stops_the_server(pool: SharedClients, tmp_path: Path) -> None:
    settings = config(tmp_path, mcp={"servers": {"t": server_table()}}, accounts=[
        {"identifier": "a.test"}, {"identifier": "b.test"},
        {"identifier": "c.test", "mcp": {"servers": {"extra": server_table()}}},
    ])
    a, b, c = narrowed(settings)
    ra, rb, rc = await pool.tools_for(a), await pool.tools_for(b), await pool.tools_for(c)
    pid, extra = await server_pid(ra), await server_pid(rc, "extra")
    assert await server_pid(rc) == pid
    await pool.release(ra)
    await pool.release(rc)  # c's registry goes; the server it shares stays for b
    assert await gone(extra) and alive(pid)
    assert pool.counts() == {"models": 0, "registries": 1, "mcp_servers": 1}
    assert await server_pid(rb) == pid
    await pool.release(rb)
    assert await gone(pid) and pool.counts() == {"models": 0, "registries": 0, "mcp_servers": 0}


async def test_share_account_keeps_one_server_per_account(pool: SharedClients, tmp_path: Path) -> None:
    settings = config(tmp_path, mcp={"servers": {"t": server_table(share="account"), "u": server_table()}})
    a, b = narrowed(settings)
    ra, rb = await asyncio.gather(pool.tools_for(a), pool.tools_for(b))
    assert ra is not rb and pool.counts() == {"models": 0, "registries": 2, "mcp_servers": 1}
    pa, pb = await server_pid(ra), await server_pid(rb)
    assert pa != pb and await server_pid(ra, "u") == await server_pid(rb, "u")
    await pool.release(ra)
    assert await gone(pa) and alive(pb)


async def test_concurrent_first_use_starts_the_server_once(pool: SharedClients, tmp_path: Path) -> None:
    settings = config(tmp_path, mcp={"servers": {"t": server_table()}},
                      accounts=[{"identifier": f"{n}.test"} for n in "abcdef"])
    registries = await asyncio.gather(*(pool.tools_for(s) for s in narrowed(settings)))
    assert all(r is registries[0] for r in registries) and pool.users(registries[0]) == 6
    assert pool.counts()["mcp_servers"] == 1


async def test_a_server_that_fails_to_start_is_tried_again_for_the_next_account(
    pool: SharedClients, tmp_path: Path,
) -> None:
    flag = tmp_path / "may-start"
    script = tmp_path / "starts_second_time.py"
    script.write_text(f"import os, runpy, sys\nif not os.path.exists({str(flag)!r}):\n    sys.exit(3)\n"
                      f"sys.argv = [{SERVER!r}]\nrunpy.run_path({SERVER!r}, run_name='__main__')\n")
    settings = config(tmp_path, mcp={"servers": {"t": {"command": [sys.executable, str(script)],
                                                       "approval": "never", "startup_timeout": 20}}})
    a, b = narrowed(settings)
    ra = await pool.tools_for(a)
    assert ra.get("mcp_t_pid") is None and "current_time" in ra  # left out, the rest works
    assert pool.counts()["mcp_servers"] == 0
    flag.write_text("")
    rb = await pool.tools_for(b)  # not the registry without the server: a new start
    assert rb is not ra and rb.get("mcp_t_pid") is not None
    assert pool.users(ra) == 1 and pool.users(rb) == 1
    rc = await pool.tools_for(a)  # the complete one is shared from now on
    assert rc is rb


# --- the Bridge hands them out and gives them back ---------------------------------------------------


class StandIn:
    """A worker that only keeps what the bridge gave it (no PDS)."""

    def __init__(self, settings: Settings, **kw: Any) -> None:
        self.settings, self.kw = settings, kw
        self.did = "did:plc:" + str(settings.account.identifier).split(".")[0]
        self.pds = type("P", (), {"session": type("S", (), {"did": self.did})(), "pds_url": "http://127.0.0.1:1"})()
        self.started = False

    async def start(self) -> None:
        if self.settings.account.identifier == "fails.test":
            raise ConfigError("this account does not start")
        self.started = True

    async def sweep_loop(self, interval: float, *, at_start: bool = False) -> None:
        await asyncio.Event().wait()

    async def aclose(self, grace: float | None = None) -> None:
        self.started = False


async def test_a_bridge_gives_every_worker_the_pools_clients_and_gives_them_back(pool: SharedClients,
                                                                               tmp_path: Path) -> None:
    from gelbridge._bridge import Bridge

    settings = config(tmp_path)
    async with Bridge(settings, worker_factory=StandIn, shared=pool, backfill=False) as bridge:
        wa, wb = (ctx.worker for ctx in bridge.accounts.values())
        assert wa.kw["model"] is wb.kw["model"] and wa.kw["registry"] is wb.kw["registry"]
        assert pool.users(wa.kw["model"]) == 2 and pool.users(wa.kw["registry"]) == 2
    assert pool.counts() == {"models": 0, "registries": 0, "mcp_servers": 0}
    assert wa.kw["model"]._closed
    failing = config(tmp_path, accounts=[{"identifier": "a.test"}, {"identifier": "fails.test"}])
    with pytest.raises(ConfigError, match="does not start"):
        await Bridge(failing, worker_factory=StandIn, shared=pool, backfill=False).start()
    assert pool.counts() == {"models": 0, "registries": 0, "mcp_servers": 0}  # what it took is given back
    client = await pool.model_for(narrowed(settings)[0])  # a given pool stays open
    assert not client._closed


async def test_the_runtimes_own_pool_reads_api_keys_from_the_process_environment(tmp_path: Path) -> None:
    """``Runtime(environ=...)`` is where app passwords are read; the providers' API keys and
    the MCP servers' variables come from the process environment, as each worker's own
    clients read them before they were shared."""
    import os

    from gelbridge._runtime import Runtime

    runtime = Runtime(config(tmp_path), environ={"GELBRIDGE_APP_PASSWORD": "x"})
    await runtime.open()
    try:
        assert runtime._shared is not None and runtime._shared.environ is os.environ
    finally:
        await runtime.close()
    assert runtime._shared is None  # its own pool is closed with it
