"""Past one machine (issue 15): many streams in one process, and a fleet of workers.

**Streams** (default): N model calls stream at once through ``ModelClient`` (the real
Lua adapter, transport and accumulator) from a slow local model server in another
process: one chunk every 50 ms for ``--seconds`` (default 30). Reported: how many
streams completed and how the others failed, the wall time against the stream's own
length, adapter work per chunk (median and p90 over the calls), peak resident memory,
and the Lua runtimes the streams needed (``--streams-per-runtime=N`` overrides
``[adapters] streams_per_runtime``). With two CPUs or more, the streams run pinned to one
CPU and the server to another (``--no-pin`` leaves both to the scheduler). Target: 1,000
streams on one core, every one complete, adapter work per chunk under 20 µs, resident
memory under 1 GB.

**Fleet** (``--fleet``): the real local PDS and PostgreSQL, ``--accounts`` accounts
(default 20), and 1, 2 and 3 ``gelbridge run`` processes sharing them (``[state] url``);
``--messages`` sealed messages per account (default 5) are sent at once and the time
until every reply is complete gives turns per second. Then one account's turns run in
this process to count the Postgres round trips a turn costs (BEGIN and COMMIT included)
and what one heartbeat costs.

Run: ``.venv/bin/python scripts/bench_scale.py [--turns=1000] [--seconds=30] [--no-pin]`` or
``.venv/bin/python scripts/bench_scale.py --fleet [--accounts=20] [--messages=5]``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any

CHUNK_DELAY = 0.05


def serve(seconds: float) -> None:
    """The slow model server (run in a child process): OpenAI Chat Completions SSE, the
    frames of the local wire server (``_dev._wire_openai``, which the official SDK's tests
    check), one every 50 ms, on asyncio so that a thousand streams at once cost the
    server little (the threaded ``ModelServer`` spends a core on a few hundred)."""
    import json as _json

    from gelbridge._dev._wire_common import Turn, WireContext
    from gelbridge._dev._wire_openai import render_stream

    chunks = max(1, int(seconds / CHUNK_DELAY))
    turn = Turn(text="word " * (chunks * 2), chunk_size=10)
    frames = render_stream(turn, WireContext(model="echo", seq=1, created=int(time.time()), prompt_text="",
                                             chunk_size=10))
    frames.append(b"data: [DONE]\n\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = _json.loads(await reader.readexactly(length)) if length else {}
                assert body.get("stream") is True
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
                for frame in frames:
                    writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    await writer.drain()
                    await asyncio.sleep(CHUNK_DELAY)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.sleep(seconds * 4 + 120)

    asyncio.run(main())


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(url: str, turns: int, streams_per_runtime: int | None = None) -> None:
    from gelbridge._adapters.client import ModelClient
    from gelbridge._config import AdaptersConfig, ProviderConfig, Settings
    from gelbridge.lux import LuxRequest, Message, Options, Text

    adapters = AdaptersConfig() if streams_per_runtime is None else AdaptersConfig(
        streams_per_runtime=streams_per_runtime)
    settings = Settings(providers={"local": ProviderConfig(adapter="openai", base_url=url + "/v1", max_retries=0,
                                                           read_timeout=60.0, deadline=900.0)},
                        adapters=adapters)
    req = LuxRequest(model="echo", conversation=[Message("user", [Text("stream for a while")])],
                     options=Options(stream=True))
    from gelbridge._adapters import host

    made = [0]
    new = host._RuntimePool._new  # noqa: SLF001 - count the Lua runtimes the streams needed

    def counting_new(self: host._RuntimePool) -> object:  # noqa: SLF001
        made[0] += 1
        return new(self)

    host._RuntimePool._new = counting_new  # type: ignore[method-assign]  # noqa: SLF001
    failures: Counter[str] = Counter()
    per_chunk: list[float] = []
    async with ModelClient(settings) as client:

        async def one() -> None:
            try:
                res = await client.complete(req, provider="local")
            except Exception as e:  # noqa: BLE001 - counted, the bench goes on
                failures[f"{type(e).__name__}({getattr(e, 'kind', '')}): {str(e)[:90]}"] += 1
                return
            if res.timing.chunks:
                per_chunk.append(res.timing.adapter_ms * 1000 / res.timing.chunks)

        start = time.monotonic()
        await asyncio.gather(*(one() for _ in range(turns)))
        wall = time.monotonic() - start
        runtimes = made[0]
    done = len(per_chunk)
    per_chunk.sort()
    print(f"{turns} concurrent streams: {done} complete, {turns - done} failed")
    for why, n in failures.most_common(3):
        print(f"  {n} x {why}")
    print(f"  wall {wall:.1f} s; one core's CPU: {time.process_time():.1f} s")
    if per_chunk:
        print(f"  adapter work per chunk: median {statistics.median(per_chunk):.1f} µs, "
              f"p90 {per_chunk[int(len(per_chunk) * 0.9)]:.1f} µs")
    print(f"  peak resident memory {rss_mb():.0f} MB; Lua runtimes created for the streams: {runtimes}")


FLEET_TOML = """
[state]
dir = "state"
url = "{url}"

[fleet]
lease_seconds = 6

[watch]
source = "firehose"

[defaults]
model = {{ provider = "local", id = "echo-1" }}

[providers.local]
adapter = "openai"
base_url = "{model}/v1"
max_retries = 0

[replies]
update_interval = 1.0

[worker]
shutdown_grace = 2
concurrency = 64
"""


def fleet_config(folder: Any, pds_url: str, accounts: list[Any], model_url: str, url: str, keyring: Any) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    keyring.save(folder / "keyring.json")
    text = FLEET_TOML.format(url=url, model=model_url)
    for i, a in enumerate(accounts):
        text += (f'\n[[accounts]]\nname = "a{i}"\npds = "{pds_url}"\nidentifier = "{a.handle}"\n'
                 f'password_env = "BENCH_PW_{i}"\nkeyring = "keyring.json"\n')
    cfg = folder / "gelbridge.toml"
    cfg.write_text(text)
    return cfg


async def send_all(pds_url: str, accounts: list[Any], keyring: Any, kid: str, per_account: int) -> list[Any]:
    """``per_account`` sealed messages on every account, each in its own conversation;
    returns (client, did, reply key) for each."""
    from gelbridge._pds import PdsClient
    from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
    from gelbridge._sealing import seal_content

    clients = []
    for a in accounts:
        c = PdsClient(pds_url)
        await c.login(a.handle, a.password)
        clients.append(c)

    async def one(c: Any, i: int) -> Any:
        rkey = new_tid()
        content = seal_content(PlainContent(parts=[TextPart(text=f"hello {i}")]),
                               uri=AtUri(c.did, MESSAGE_COLLECTION, rkey), key_id=kid, keyring=keyring)
        await c.put_record(MESSAGE_COLLECTION, rkey, {
            "$type": MESSAGE_COLLECTION, "conversation": new_tid(), "role": "user", "content": content.to_value(),
            "generation": {"attempt": 0}, "createdAt": now_datetime()})
        return c, f"{rkey}.r0"

    return list(await asyncio.gather(*(one(c, i) for c in clients for i in range(per_account))))


async def wait_complete(sent: list[Any], timeout: float) -> int:
    from gelbridge._records import MESSAGE_COLLECTION

    left = list(sent)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        still = []
        for c, rk in left:
            got = await c.get_record(MESSAGE_COLLECTION, rk)
            if got is None or got[1].get("status") != "complete":
                still.append((c, rk))
        left = still
        if left:
            await asyncio.sleep(0.5)
    return len(sent) - len(left)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_fleet(args: dict[str, str]) -> None:
    import tempfile
    from pathlib import Path

    import psycopg

    from gelbridge._dev.model_server import ModelServer
    from gelbridge._dev.pds import DevPds, create_account
    from gelbridge._dev.postgres import DevPostgres
    from gelbridge._records import new_tid
    from gelbridge._sealing import Keyring

    n_accounts, per = int(args.get("accounts", 20)), int(args.get("messages", 5))
    tmp = Path(tempfile.mkdtemp(prefix="gelbridge-bench-fleet-"))
    keyring = Keyring()
    kid = keyring.add_new("k-bench")
    with DevPds() as pds, DevPostgres() as pg, ModelServer(record_requests=False) as model:
        accounts = [create_account(pds.pds_url, f"b{i}x{new_tid()[-6:]}.test", f"pw-bench-{i}")
                    for i in range(n_accounts)]
        env = {**os.environ, **{f"BENCH_PW_{i}": a.app_password for i, a in enumerate(accounts)}}
        print(f"fleet: {n_accounts} accounts on the local PDS, {per} messages each, echo model, "
              f"PostgreSQL {pg.url.rsplit('/', 1)[0]}")
        for workers in (1, 2, 3):
            url = pg.create_database(f"bench{workers}")
            cfg = fleet_config(tmp / f"w{workers}", pds.pds_url, accounts, model.url, url, keyring)
            procs = [subprocess.Popen([sys.executable, "-m", "gelbridge", "run", "--config", str(cfg),
                                       "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=open(tmp / f"w{workers}-{i}.log", "wb"))
                     for i in range(workers)]
            try:
                share = -(-n_accounts // workers)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        with psycopg.connect(url) as conn:
                            rows = conn.execute("SELECT owner, count(*) FROM leases WHERE expires_at > now() "
                                                "GROUP BY owner").fetchall()
                    except psycopg.errors.UndefinedTable:  # no worker has migrated the database yet
                        rows = []
                    if any(p.poll() is not None for p in procs):
                        raise SystemExit(f"a worker exited; see {tmp}")
                    if sum(r[1] for r in rows) == n_accounts and len(rows) == workers and \
                            max(r[1] for r in rows) <= share:
                        break
                    time.sleep(0.5)
                else:
                    raise SystemExit(f"the {workers} worker(s) did not spread the accounts within 120 s")
                time.sleep(3)  # every account's bridge is subscribed

                async def measure() -> tuple[int, float]:
                    t0 = time.monotonic()
                    sent = await send_all(pds.pds_url, accounts, keyring, kid, per)
                    done = await wait_complete(sent, 300)
                    took = time.monotonic() - t0
                    for c in {id(c): c for c, _ in sent}.values():
                        await c.aclose()
                    return done, took

                cpu0 = sum(cpu_seconds(p.pid) for p in procs)
                done, took = asyncio.run(measure())
                cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
                print(f"  {workers} worker(s): {done}/{n_accounts * per} turns complete in {took:.1f} s: "
                      f"{done / took:.1f} turns/s; the workers used {cpu:.1f} CPU-s "
                      f"({cpu / max(done, 1) * 1000:.0f} ms a turn, {cpu / took * 100:.0f} % of a core)")
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(60)
        round_trips(pds.pds_url, accounts[0], pg, model.url, keyring, kid, tmp)


def round_trips(pds_url: str, account: Any, pg: Any, model_url: str, keyring: Any, kid: str, folder: Any) -> None:
    """One account served by a Fleet in this process: Postgres round trips per turn."""
    from gelbridge._config import load_config
    from gelbridge._fleet import Fleet

    url = pg.create_database("benchtrips")
    cfg = fleet_config(folder / "trips", pds_url, [account], model_url, url, keyring)
    settings = load_config(cfg, env={"BENCH_PW_0": account.app_password})

    async def go() -> None:
        fleet = Fleet(settings, environ={"BENCH_PW_0": account.app_password})
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(fleet.run(stop, ready=ready))
        await asyncio.wait_for(ready.wait(), 60)
        await asyncio.sleep(4)  # logged in, backfilled, subscribed
        store = fleet.store
        assert store is not None
        base, beats0 = store.round_trips, fleet.beats
        t0 = time.monotonic()
        sent = await send_all(pds_url, [account], keyring, kid, 20)
        done = await wait_complete(sent, 120)
        await asyncio.sleep(1.0)  # the last turns' timings are recorded
        trips, beats = store.round_trips - base, fleet.beats - beats0
        took = time.monotonic() - t0
        stop.set()
        await asyncio.wait_for(task, 60)
        for c in {id(c): c for c, _ in sent}.values():
            await c.aclose()
        per_beat = 8  # BEGIN, member upsert, expiry delete, count, renew, take (when short), next expiry, COMMIT
        print(f"round trips: {done} turns on one account in {took:.1f} s: {trips} statements to Postgres, "
              f"{beats} heartbeat(s) of ~{per_beat}; {(trips - beats * per_beat) / max(done, 1):.1f} per turn "
              "(claim, status, journal, turn timing, write budget, seen event, cursor; BEGIN/COMMIT included)")

    asyncio.run(go())


def main() -> None:
    args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    if "serve" in args:
        serve(float(args["serve"]))
        return
    if "--fleet" in sys.argv[1:]:
        run_fleet(args)
        return
    turns, seconds = int(args.get("turns", 1000)), float(args.get("seconds", 30))
    child = subprocess.Popen([sys.executable, __file__, f"--serve={seconds}"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        print(f"model server {url}: one chunk every {CHUNK_DELAY * 1000:.0f} ms for {seconds:g} s per stream")
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(cpus) >= 2 and "--no-pin" not in sys.argv[1:]:
            # "One core": the streams on one CPU, the model server on another, so neither
            # moves the other off its core (each move leaves a core's caches behind).
            os.sched_setaffinity(child.pid, {cpus[-1]})
            os.sched_setaffinity(0, {cpus[0]})
            print(f"streams pinned to CPU {cpus[0]}, the model server to CPU {cpus[-1]} (--no-pin: neither)")
        spr = int(args["streams-per-runtime"]) if "streams-per-runtime" in args else None
        asyncio.run(run(url, turns, spr))
    finally:
        child.terminate()
        child.wait(10)


if __name__ == "__main__":
    main()
