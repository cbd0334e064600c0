"""Benchmark the worker end to end on this machine: dev PDS + instant echo model.

Measures, for sealed user messages written like a chat app writes them:

- latency (one message at a time): median time from the user record's commit
  (putRecord returned) to its reply being claimed (``K.r0`` exists) and to the reply
  being complete, observed by polling getRecord every few ms; plus the worker's own
  per-turn split (queue / bridge / model / write) and the firehose delivery time;
- throughput: N messages spread over C conversations written at once; turns per second
  from the first commit to the last complete reply.

Usage: .venv/bin/python scripts/bench_worker.py [--messages 20] [--conversations 20] [--per-conv 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import statistics
import tempfile
import time
from pathlib import Path

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import DevPds, create_account
from gelbridge._pds import PdsClient
from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
from gelbridge._runtime import Runtime
from gelbridge._sealing import Keyring, seal_content

ENV = "GELBRIDGE_BENCH_APP_PASSWORD"


async def send(app: PdsClient, kr: Keyring, kid: str, conv: str, text: str) -> str:
    rkey = new_tid()
    sealed = seal_content(PlainContent(parts=[TextPart(text=text)]),
                          uri=AtUri(app.did, MESSAGE_COLLECTION, rkey), key_id=kid, keyring=kr)
    await app.put_record(MESSAGE_COLLECTION, rkey, {
        "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user", "content": sealed.to_value(),
        "generation": {"attempt": 0}, "createdAt": now_datetime(),
    })
    return rkey


async def watch(app: PdsClient, reply: str, t_commit: float, timeout: float = 60) -> tuple[float, float]:
    claimed = None
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        got = await app.get_record(MESSAGE_COLLECTION, reply)
        now = time.perf_counter()
        if got is not None:
            if claimed is None:
                claimed = now - t_commit
            if got[1].get("status") == "complete":
                return claimed * 1000, (now - t_commit) * 1000
        await asyncio.sleep(0.003)
    raise TimeoutError(reply)


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.1f}" if xs else "      -"


async def main_async(args: argparse.Namespace, pds: DevPds, server: ModelServer, base: Path) -> None:
    acct = create_account(pds.pds_url, f"bench{secrets.token_hex(3)}.test", secrets.token_urlsafe(12))
    kr = Keyring()
    kid = kr.add_new()
    settings = Settings.model_validate({
        "account": {"pds": pds.pds_url, "identifier": acct.handle, "password_env": ENV},
        "state": {"dir": str(base / "state")},
        "defaults": {"model": {"provider": "local", "id": "echo-1"}},
        "providers": {"local": {"adapter": "openai", "base_url": server.url + "/v1", "max_retries": 0}},
        "replies": {"update_interval": 2.0},
        "worker": {"concurrency": args.conversations},
    })
    runtime = Runtime(settings, keyrings={acct.handle: kr}, environ={ENV: acct.app_password})
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(runtime.run(stop, ready=ready))
    await asyncio.wait_for(ready.wait(), 60)
    [served] = runtime.router
    worker = served.worker
    for src in runtime.intake.sources.values():
        await asyncio.wait_for(src.connected.wait(), 30)

    # firehose delivery: commit → event seen by a second subscriber
    from contextlib import aclosing

    from gelbridge._firehose import subscribe_repos

    async with PdsClient(pds.pds_url) as app:
        await app.login(acct.handle, acct.password)

        fh: list[float] = []
        for _ in range(5):
            seen = asyncio.Event()
            target: dict[str, str] = {}

            async def sub() -> None:
                async with aclosing(subscribe_repos(pds.pds_url, cursor=None, did_filter={app.did})) as evs:
                    async for ev in evs:
                        if ev.rkey == target.get("rkey"):
                            seen.set()
                            return

            t = asyncio.create_task(sub())
            await asyncio.sleep(0.3)
            rk = new_tid()
            target["rkey"] = rk
            t0 = time.perf_counter()
            await app.put_record(MESSAGE_COLLECTION, rk, {  # no generation: the worker ignores it
                "$type": MESSAGE_COLLECTION, "conversation": "bench", "role": "user", "createdAt": now_datetime(),
                "content": {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}})
            await asyncio.wait_for(seen.wait(), 10)
            fh.append((time.perf_counter() - t0) * 1000)
            t.cancel()

        # latency, one at a time
        claim_ms: list[float] = []
        done_ms: list[float] = []
        for i in range(args.messages):
            t0 = time.perf_counter()
            rk = await send(app, kr, kid, new_tid(), f"latency probe {i}")
            t_commit = time.perf_counter()
            c, d = await watch(app, f"{rk}.r0", t_commit)
            claim_ms.append(c)
            done_ms.append(d)
            del t0
        await worker.wait_idle(10)
        turns = list(worker.reports[-args.messages:])

        # throughput
        n = args.conversations * args.per_conv
        convs = [new_tid() for _ in range(args.conversations)]
        t_first = time.perf_counter()
        sent = await asyncio.gather(*(send(app, kr, kid, convs[i % len(convs)], f"load {i}") for i in range(n)))
        t_sent = time.perf_counter()
        await asyncio.wait_for(worker.wait_idle(300), 310)
        # confirm completion on the PDS
        for rk in sent:
            got = await app.get_record(MESSAGE_COLLECTION, f"{rk}.r0")
            assert got is not None and got[1].get("status") == "complete", rk
        t_done = max(time.perf_counter(), t_sent)
        load_turns = list(worker.reports[-n:])

    stop.set()
    await asyncio.wait_for(task, 60)

    print(f"\nfirehose delivery (commit → event at a subscriber), median of {len(fh)}: {med(fh)} ms")
    print(f"latency, {args.messages} messages one at a time (medians, ms):")
    print(f"  commit → reply claimed  {med(claim_ms)}")
    print(f"  commit → reply complete {med(done_ms)}")
    print(f"  worker turn: queue {med([t.timing.queue_ms for t in turns])}  bridge "
          f"{med([t.timing.bridge_ms for t in turns])}  model {med([t.timing.model_ms for t in turns])}  "
          f"write {med([t.timing.write_ms for t in turns])}")
    print(f"throughput: {n} messages over {args.conversations} conversations "
          f"(concurrency {args.conversations})")
    print(f"  {n / (t_done - t_first):.1f} turns/s  (first commit → last complete {t_done - t_first:.2f} s)")
    print(f"  per-turn medians under load: queue {med([t.timing.queue_ms for t in load_turns])}  bridge "
          f"{med([t.timing.bridge_ms for t in load_turns])}  model {med([t.timing.model_ms for t in load_turns])}  "
          f"write {med([t.timing.write_ms for t in load_turns])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20)
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--per-conv", type=int, default=5)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base = Path(tempfile.mkdtemp(prefix="gelbridge-bench-"))
    with DevPds() as pds, ModelServer(record_requests=False) as server:
        asyncio.run(main_async(args, pds, server, base))


if __name__ == "__main__":
    main()
