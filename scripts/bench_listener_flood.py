"""Benchmark what a flood of the health/metrics listener costs a worker's turns.

A real worker process (``gelbridge run``'s runtime, RLIMIT_NOFILE 1024 as in the issue, ``[observability]
listen`` on loopback) answers sealed messages from the local PDS with the local echo model
(a new model connection per call). For each code tree (``--before``, default /work/main,
and this one) it runs twice: quiet, and under a flood from a separate process:

- 1,100 slow connections (a request line, then a header line every 2 s; reopened 1 s after
  the server closes one),
- one connection writing header lines as fast as it can (reopened when cut),
- 4 clients scraping ``/metrics`` back to back, a new connection each.

Per run: the median time from a message's commit to its reply's final write (messages
one at a time), how the turns ended, the worker's CPU seconds per wall second over the
turns, its log bytes per second, and how many fresh ``/healthz`` probes (one every 0.5 s)
were answered 200.

Usage: .venv/bin/python scripts/bench_listener_flood.py [--messages 15] [--before /work/main]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
ENV = "GELBRIDGE_BENCH_APP_PASSWORD"
HOST = "127.0.0.1"


# --- the worker process -------------------------------------------------------------------

def worker_main(cfg: dict[str, Any]) -> None:
    import logging

    import gelbridge
    from gelbridge._config import Settings
    from gelbridge._sealing import Keyring

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.model_validate({
        "account": {"pds": cfg["pds"], "identifier": cfg["handle"], "password_env": ENV},
        "state": {"dir": cfg["state"]},
        "defaults": {"model": {"provider": "local", "id": "echo-1"}},
        "providers": {"local": {"adapter": "openai", "base_url": cfg["model"] + "/v1", "max_retries": 0}},
        "observability": {"listen": f"{HOST}:0"},
    })
    keyring = Keyring.load(cfg["keyring"])

    async def run() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            from gelbridge._runtime import Runtime
        except ImportError:  # a tree from before the runtime (the "before" side of a run)
            from gelbridge._worker import Worker

            worker = Worker(settings, keyring=keyring, environ={ENV: cfg["password"]}, out=sys.stderr)
            task = asyncio.create_task(worker.run(stop, ready=ready))  # type: ignore[attr-defined]
            await asyncio.wait_for(ready.wait(), 60)
            await asyncio.wait_for(worker.source.connected.wait(), 30)  # type: ignore[attr-defined]
            http = worker.http  # type: ignore[attr-defined]
        else:
            runtime = Runtime(settings, keyrings={cfg["handle"]: keyring}, environ={ENV: cfg["password"]})
            task = asyncio.create_task(runtime.run(stop, ready=ready, out=sys.stderr))
            await asyncio.wait_for(ready.wait(), 60)
            for src in runtime.intake.sources.values():
                await asyncio.wait_for(src.connected.wait(), 30)
            assert runtime.watched is not None
            http = runtime.watched.http
        print("BENCH-READY", http.sockets[0].getsockname()[1], gelbridge.__file__, flush=True)
        await task

    asyncio.run(run())


# --- the flood process --------------------------------------------------------------------

async def flood_main(port: int, slow: int, scrapers: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    n: Counter[str] = Counter()

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
        except (OSError, TimeoutError):
            n["connect failed"] += 1
            await asyncio.sleep(1)
            return None

    async def slowloris() -> None:
        while not stop.is_set():
            if (c := await connect()) is None:
                continue
            n["slow opened"] += 1
            r, w = c
            try:
                w.write(b"GET /metrics HTTP/1.1\r\n")
                for i in range(10**6):
                    w.write(b"X-Slow-%d: 1\r\n" % i)
                    await w.drain()
                    try:
                        await asyncio.wait_for(r.read(1024), 2)
                        break  # answered or closed by the server
                    except TimeoutError:
                        if stop.is_set():
                            break
            except OSError:
                pass
            w.close()
            await asyncio.sleep(1)

    async def header_flood() -> None:
        chunk = b"".join(b"X-Flood-%d: %s\r\n" % (i, b"b" * 1000) for i in range(64))
        while not stop.is_set():
            if (c := await connect()) is None:
                continue
            _, w = c
            try:
                w.write(b"GET /metrics HTTP/1.1\r\n")
                while not stop.is_set():
                    w.write(chunk)
                    await w.drain()
                    n["flood bytes"] += len(chunk)
            except OSError:
                n["flood cut"] += 1
            w.close()
            await asyncio.sleep(0.1)

    async def scraper() -> None:
        while not stop.is_set():
            if (c := await connect()) is None:
                continue
            r, w = c
            try:
                w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                got = await asyncio.wait_for(r.read(), 10)
                n["scrapes 200" if got.startswith(b"HTTP/1.1 200") else "scrapes other"] += 1
            except (OSError, TimeoutError):
                n["scrapes failed"] += 1
            w.close()

    tasks = [asyncio.create_task(f()) for f in [slowloris] * slow + [header_flood] + [scraper] * scrapers]
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(dict(n)), flush=True)


# --- the measuring side -------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def probe(port: int, stop: asyncio.Event, seen: Counter[str]) -> None:
    while not stop.is_set():
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(HOST, port), 2)
            w.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            got = await asyncio.wait_for(r.read(), 2)
            w.close()
            seen["ok" if got.startswith(b"HTTP/1.1 200") else "not 200"] += 1
        except (OSError, TimeoutError):
            seen["failed"] += 1
        await asyncio.sleep(0.5)


async def one_run(tree: Path, flood: bool, args: argparse.Namespace, pds: Any, model: Any, base: Path) -> dict[str, Any]:
    from gelbridge._dev.pds import create_account
    from gelbridge._pds import PdsClient
    from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
    from gelbridge._sealing import Keyring, seal_content

    acct = create_account(pds.pds_url, f"flood{secrets.token_hex(3)}.test", secrets.token_urlsafe(12))
    kr = Keyring()
    kid = kr.add_new()
    run_dir = Path(tempfile.mkdtemp(dir=base))
    (run_dir / "keyring.json").write_text(json.dumps(kr.to_json()))
    cfg = {"pds": pds.pds_url, "handle": acct.handle, "password": acct.app_password, "state": str(run_dir / "state"),
           "model": model.url, "keyring": str(run_dir / "keyring.json")}
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = run_dir / "worker.log"
    with log.open("w") as err:
        worker = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(cfg)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=err)
    assert worker.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 120)
    if not line.startswith("BENCH-READY"):
        raise SystemExit(f"the worker did not start ({tree}): {log.read_text()[-2000:]}")
    _, port, where = line.split()
    assert where.startswith(str(tree)), where
    flooder = None
    if flood:
        flooder = subprocess.Popen([sys.executable, __file__, "--flood", port], env=env, text=True,
                                   stdout=subprocess.PIPE)
        await asyncio.sleep(args.settle)
    stop_probe, probes = asyncio.Event(), Counter[str]()
    prober = asyncio.create_task(probe(int(port), stop_probe, probes))
    latency, ends = [], Counter[str]()
    cpu0, log0, t0 = cpu_seconds(worker.pid), log.stat().st_size, time.monotonic()
    async with PdsClient(pds.pds_url) as app:
        await app.login(acct.handle, acct.password)
        for i in range(args.messages):
            rkey = new_tid()
            sealed = seal_content(PlainContent(parts=[TextPart(text=f"probe {i}")]),
                                  uri=AtUri(app.did, MESSAGE_COLLECTION, rkey), key_id=kid, keyring=kr)
            await app.put_record(MESSAGE_COLLECTION, rkey, {
                "$type": MESSAGE_COLLECTION, "conversation": new_tid(), "role": "user",
                "content": sealed.to_value(), "generation": {"attempt": 0}, "createdAt": now_datetime()})
            t_commit, end = time.perf_counter(), "no final write in 60 s"
            while time.perf_counter() - t_commit < 60:
                got = await app.get_record(MESSAGE_COLLECTION, f"{rkey}.r0")
                status = got[1].get("status") if got is not None else None
                if status in ("complete", "error", "cancelled", "awaitingApproval"):
                    kind = (got[1].get("error") or {}).get("kind") if got is not None else None
                    end = f"{status}/{kind}" if kind else str(status)
                    latency.append((time.perf_counter() - t_commit) * 1000)
                    break
                await asyncio.sleep(0.01)
            ends[end] += 1
    wall = time.monotonic() - t0
    cpu, log_bytes = cpu_seconds(worker.pid) - cpu0, log.stat().st_size - log0
    stop_probe.set()
    await prober
    flood_counts = {}
    if flooder is not None:
        flooder.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(flooder.communicate, timeout=60)
        flood_counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    worker.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(worker.wait, 60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)
    return {"latency_ms": statistics.median(latency) if latency else float("nan"), "ends": dict(ends),
            "cpu_per_s": cpu / wall, "log_bytes_per_s": log_bytes / wall, "probes": dict(probes),
            "flood": flood_counts, "wall_s": wall}


def show(name: str, r: dict[str, Any]) -> None:
    ends = ", ".join(f"{k} {v}" for k, v in sorted(r["ends"].items()))
    probes = r["probes"]
    print(f"{name:<16} {r['latency_ms']:9.0f} {r['cpu_per_s']:9.2f} {r['log_bytes_per_s']:11.0f}   "
          f"{probes.get('ok', 0)}/{sum(probes.values())}   {ends}")
    if r["flood"]:
        print(f"{'':<16} flood: {', '.join(f'{k} {v}' for k, v in sorted(r['flood'].items()))}")


async def main_async(args: argparse.Namespace) -> None:
    from gelbridge._dev.model_server import ModelServer
    from gelbridge._dev.pds import DevPds

    base = Path(tempfile.mkdtemp(prefix="gelbridge-bench-flood-"))
    trees = [("before", Path(args.before).resolve()), ("after", HERE)]
    results = {}
    with DevPds() as pds, ModelServer(record_requests=False) as model:
        for label, tree in trees:
            for flood in (False, True):
                name = f"{label}, {'flood' if flood else 'quiet'}"
                results[name] = await one_run(tree, flood, args, pds, model, base)
                print(f"  done: {name}", file=sys.stderr, flush=True)
    print(f"\n{args.messages} messages one at a time; worker RLIMIT_NOFILE 1024; before = {args.before}")
    print("turn ms: median, a message's commit to its reply's final write; cpu s/s: the worker's CPU seconds a\n"
          "second over the turns; log B/s: its log; healthz: fresh probes answered 200 (of those made)")
    print(f"{'run':<16} {'turn ms':>9} {'cpu s/s':>9} {'log B/s':>11}   healthz   how the turns ended")
    for name, r in results.items():
        show(name, r)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker_main(json.loads(sys.argv[2]))
    if sys.argv[1:2] == ["--flood"]:
        return asyncio.run(flood_main(int(sys.argv[2]), slow=1100, scrapers=4))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=15)
    p.add_argument("--before", default="/work/main", help="the code tree to compare with (its PYTHONPATH)")
    p.add_argument("--settle", type=float, default=5.0, help="seconds the flood runs before the first message")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
