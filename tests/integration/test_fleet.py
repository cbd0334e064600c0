"""A fleet on the real local PDS and PostgreSQL: three `gelbridge run` processes share six
accounts; one is SIGKILLed mid-stream and another mid-tool-call; every message is
answered exactly once with a complete reply, no tool runs twice (a real MCP server counts
its executions in a file), and the dead workers' accounts are served again within the
lease time. A worker cut off from Postgres stops writing before its lease could be taken."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from gelbridge._dev.model_server import ModelServer, RecordedRequest, ToolCall, Turn, echo_turn, last_user_text
from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._pds import PdsClient
from gelbridge._records import new_tid
from gelbridge._records.models import ToolResultPart
from gelbridge._sealing import Keyring

from .conftest import App, text_of
from .proxy import TcpProxy
from .worker_proc import COUNTING_SERVER, WorkerProc

pytestmark = [pytest.mark.pds, pytest.mark.postgres, pytest.mark.timeout(300)]

LEASE = 4.0  # [fleet] lease_seconds: short, so a takeover is quick to see
SLOW = Turn(text="slow " * 80, chunk_size=5, chunk_delay=0.1)  # ~8 s of streaming


def responder(req: RecordedRequest) -> Any:
    """The model every worker calls: by the last message, so any worker gets the same."""
    msgs = req.body.get("messages") or []
    last = msgs[-1] if msgs else {}
    if last.get("role") == "tool":
        return Turn(text=f"the tool said: {last.get('content')}")
    text = last_user_text(req.body)
    if text.startswith("slow"):
        return SLOW
    if text.startswith("tool"):
        return Turn(tool_calls=[ToolCall("mcp_j_gate", {"text": text}, id="g1")])
    return echo_turn(req.body)


def fleet_config(tmp: Path, pds_url: str, accounts: list[AccountInfo], model_url: str, postgres_url: str,
                 count_file: Path, gate_file: Path, keyring: Keyring, watch: str = "") -> Path:
    """``watch``: a ``[watch]`` section (default: none, the firehose)."""
    keyring.save(tmp / "keyring.json")
    entries = "".join(f"""
[[accounts]]
name = "a{i}"
pds = "{pds_url}"
identifier = "{a.handle}"
password_env = "FLEET_PW_{i}"
keyring = "keyring.json"
""" for i, a in enumerate(accounts))
    cfg = tmp / "gelbridge.toml"
    cfg.write_text(f"""
[state]
dir = "state"
url = "{postgres_url}"

[fleet]
lease_seconds = {LEASE}

[defaults]
model = {{ provider = "local", id = "echo-1" }}
tools = ["mcp_j_gate"]

[providers.local]
adapter = "openai"
base_url = "{model_url}/v1"
max_retries = 0

[replies]
update_interval = 0.2

[worker]
shutdown_grace = 2

[tools]
call_timeout = 150

[mcp.servers.j]
command = {json.dumps([sys.executable, COUNTING_SERVER])}
env = {{ COUNT_FILE = {json.dumps(str(count_file))}, GATE_FILE = {json.dumps(str(gate_file))} }}
approval = "never"
startup_timeout = 60
{watch}
{entries}""")
    return cfg


def owners(postgres_url: str) -> dict[str, str | None]:
    """Lease key -> owner member (``host:pid:tail``), live leases only."""
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT account, CASE WHEN expires_at > now() THEN owner END FROM leases").fetchall()
    return {r[0]: r[1] for r in rows}


def pid_of(member: str | None) -> int | None:
    return int(member.split(":")[-2]) if member else None


async def wait_for(what: str, check: Any, timeout: float) -> float:
    """Poll ``check()`` until true; the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


class Fleet:
    def __init__(self, tmp: Path, dev_pds: DevPds, postgres_url: str, n_accounts: int) -> None:
        self.tmp, self.dev_pds, self.url = tmp, dev_pds, postgres_url
        self.accounts = [create_account(dev_pds.pds_url, f"f{i}x{new_tid()[-6:]}.test", f"pw-fleet-{i}")
                         for i in range(n_accounts)]
        self.env = {f"FLEET_PW_{i}": a.app_password for i, a in enumerate(self.accounts)}
        self.count_file, self.gate_file = tmp / "count.txt", tmp / "gate"
        self.procs: list[WorkerProc] = []
        self.apps: dict[str, App] = {}
        self.keyring = Keyring()
        self.kid = self.keyring.add_new("k-fleet")

    def key(self, account: AccountInfo) -> str:
        return account.handle  # the lease key: the login identifier

    def config(self, model_url: str, name: str = "gelbridge.toml", pds_url: str | None = None,
               postgres_url: str | None = None, watch: str = "") -> Path:
        d = self.tmp / name.removesuffix(".toml")
        d.mkdir(exist_ok=True)
        return fleet_config(d, pds_url or self.dev_pds.pds_url, self.accounts, model_url,
                            postgres_url or self.url, self.count_file, self.gate_file, self.keyring, watch)

    async def start(self, cfg: Path, name: str) -> WorkerProc:
        w = WorkerProc(cfg, None, self.tmp / f"{name}.log", env=self.env)
        self.procs.append(w)
        await asyncio.to_thread(w.start, 90)
        return w

    def held_by(self, w: WorkerProc) -> list[AccountInfo]:
        got = owners(self.url)
        return [a for a in self.accounts if pid_of(got.get(self.key(a))) == w.pid]

    def executions(self) -> list[str]:
        return self.count_file.read_text().splitlines() if self.count_file.exists() else []

    async def apps_for(self, stack: AsyncExitStack) -> None:
        for a in self.accounts:
            pds = await stack.enter_async_context(PdsClient(self.dev_pds.pds_url))
            await pds.login(a.handle, a.password)
            self.apps[a.did] = App(pds, self.keyring, self.kid)

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture
async def fleet(tmp_path: Path, dev_pds: DevPds, postgres_url: str) -> AsyncIterator[Fleet]:
    f = Fleet(tmp_path, dev_pds, postgres_url, 6)
    try:
        yield f
    finally:
        f.stop()
        for p in f.procs:  # shown by pytest only when the test failed: what each worker saw
            tail = p.log_path.read_text(errors="replace")[-6000:] if p.log_path.exists() else "(no log)"
            print(f"--- {p.log_path.name}, last lines ---\n{tail}")


async def test_three_workers_six_accounts_two_killed_every_message_answered_once(fleet: Fleet) -> None:
    with ModelServer(responder=responder) as model:
        cfg = fleet.config(model.url)
        async with AsyncExitStack() as stack:
            await fleet.apps_for(stack)
            w1 = await fleet.start(cfg, "w1")
            w2 = await fleet.start(cfg, "w2")
            w3 = await fleet.start(cfg, "w3")
            workers = [w1, w2, w3]
            await wait_for("an even spread (2 accounts each)",
                           lambda: sorted(len(fleet.held_by(w)) for w in workers) == [2, 2, 2], 60)
            status = json.loads(subprocess.run(
                [sys.executable, "-m", "gelbridge", "status", "--config", str(cfg), "--json"],
                capture_output=True, text=True, timeout=60, check=True).stdout)
            assert len(status["fleet"]["members"]) == 3 and status["backend"] == "postgres"
            by = Counter(pid_of(a["lease"]["owner"]) for a in status["accounts"])
            assert by == {w.pid: 2 for w in workers}

            # sealed messages arrive on all six accounts: each answered once, completely
            first: dict[str, str] = {}
            for a in fleet.accounts:
                app = fleet.apps[a.did]
                first[a.did] = await app.send(f"hello {a.handle}", conversation=new_tid())
            for a in fleet.accounts:
                _, c = await fleet.apps[a.did].wait_status(f"{first[a.did]}.r0", "complete", timeout=60)
                assert text_of(c) == f"You said: hello {a.handle}"

            # w1 dies mid-stream, w2 mid-tool-call
            streamer, caller = fleet.held_by(w1)[0], fleet.held_by(w2)[0]
            slow = await fleet.apps[streamer.did].send("slow please", conversation=new_tid())
            tool = await fleet.apps[caller.did].send("tool please", conversation=new_tid())
            await fleet.apps[streamer.did].wait_status(f"{slow}.r0", "streaming", timeout=60, interval=0.05)
            await wait_for("the gate tool to start", lambda: len(fleet.executions()) == 1, 60)
            dead = fleet.held_by(w1) + fleet.held_by(w2)
            w1.kill()
            w2.kill()
            killed_at = time.monotonic()
            fleet.gate_file.touch()  # were the call run again, it would finish now (and be counted)

            took = await wait_for("w3 to hold every account",
                                  lambda: len(fleet.held_by(w3)) == 6, LEASE + 10)
            assert took <= LEASE + 1.5, f"takeover after {took:.1f} s; the lease is {LEASE:g} s"

            rec, c = await fleet.apps[streamer.did].wait_status(f"{slow}.r0", {"complete", "error"}, timeout=90)
            assert rec.status == "complete" and text_of(c) == SLOW.text  # resumed from scratch, whole
            rec, c = await fleet.apps[caller.did].wait_status(f"{tool}.r0", {"complete", "error"}, timeout=90)
            assert rec.status == "complete"
            assert c is not None
            [result] = [p for p in c.parts if isinstance(p, ToolResultPart)]
            assert result.call_id == "g1" and result.is_error and "interrupted" in result.output  # not run again
            assert "the tool said" in text_of(c)
            assert Counter(e.split()[0] for e in fleet.executions()) == {"gate": 1}

            # the dead workers' accounts are served: a new message on each is answered
            again = {a.did: await fleet.apps[a.did].send(f"again {a.handle}", conversation=new_tid()) for a in dead}
            for did, rkey in again.items():
                _, c = await fleet.apps[did].wait_status(f"{rkey}.r0", "complete", timeout=60)
                assert text_of(c).startswith("You said: again ")
            assert time.monotonic() - killed_at < 120

            # exactly once: one reply record per message, on every account
            for a in fleet.accounts:
                app = fleet.apps[a.did]
                for rkey in [first[a.did], again.get(a.did), slow if a is streamer else None,
                             tool if a is caller else None]:
                    if rkey is not None:
                        assert await app.replies_of(rkey) == [f"{rkey}.r0"]
            assert w3.proc is not None and w3.proc.poll() is None
            assert w3.terminate() == 0


async def test_a_worker_cut_off_from_postgres_stops_writing_before_its_lease_can_be_taken(
    tmp_path: Path, dev_pds: DevPds, postgres_url: str,
) -> None:
    fleet = Fleet(tmp_path, dev_pds, postgres_url, 2)
    pg = urlsplit(postgres_url)
    pds = urlsplit(dev_pds.pds_url)
    pg_proxy = await TcpProxy(pg.hostname or "127.0.0.1", pg.port or 5432).start()
    pds_proxy = await TcpProxy(pds.hostname or "127.0.0.1", pds.port or 80).start()
    try:
        with ModelServer(responder=responder) as model:
            cut_cfg = fleet.config(model.url, "cut.toml", pds_url=f"http://localhost:{pds_proxy.port}",
                                   postgres_url=postgres_url.replace(f":{pg.port}/", f":{pg_proxy.port}/"))
            cfg = fleet.config(model.url)
            async with AsyncExitStack() as stack:
                await fleet.apps_for(stack)
                x = await fleet.start(cut_cfg, "x")
                y = await fleet.start(cfg, "y")
                await wait_for("one account each", lambda: len(fleet.held_by(x)) == len(fleet.held_by(y)) == 1, 60)
                [mine] = fleet.held_by(x)
                app = fleet.apps[mine.did]
                slow = await app.send("slow please", conversation=new_tid())
                await app.wait_status(f"{slow}.r0", "streaming", timeout=60, interval=0.05)

                await pg_proxy.outage()  # x can no longer beat; y can
                cut_at = time.time()
                with psycopg.connect(postgres_url) as conn:
                    (expires,) = conn.execute("SELECT EXTRACT(EPOCH FROM expires_at) FROM leases WHERE account = %s",
                                              (fleet.key(mine),)).fetchone()
                await wait_for("y to take the account over", lambda: len(fleet.held_by(y)) == 2, LEASE + 10)
                taken_at = time.time()
                assert taken_at >= float(expires)  # taken only once the lease ran out
                rec, c = await app.wait_status(f"{slow}.r0", {"complete", "error"}, timeout=90)
                assert rec.status == "complete" and text_of(c) == SLOW.text
                after_cut = [t for t in pds_proxy.posts if t > cut_at]
                assert after_cut, "x kept streaming until its own clock said the lease was no longer safe"
                assert max(pds_proxy.posts) < float(expires), (
                    f"x wrote {max(pds_proxy.posts) - float(expires):.2f} s after its lease could be taken")
                assert await app.replies_of(slow) == [f"{slow}.r0"]
                assert x.proc is not None and x.proc.poll() is None  # still running, not serving
                log = (tmp_path / "x.log").read_text()
                assert "ran out without a heartbeat" in log and "Traceback" not in log
    finally:
        fleet.stop()
        await pg_proxy.aclose()
        await pds_proxy.aclose()
