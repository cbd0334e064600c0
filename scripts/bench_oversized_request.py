"""The oversized-request attack of issue 23 (point 1), re-run before and after the fix.

Each run starts ``gelbridge run`` as a real process on the real local PDS, with the
local echo model behind the built-in ``openai`` adapter, and sends it the issue's
message: ~50 KB sealed, 100 file parts that all name one 1 MiB text blob. Then, if the
process is still up, a normal message; then the process is stopped and started again
(the issue's restart loop: its backfill meets whatever is still owed). Measured:

- ``attack``: seconds from writing the message to its reply's final status (complete
  or error), or to the process's exit; the process's exit code (``running`` if it
  lives) and its peak RSS (``VmHWM``, sampled every 50 ms until the reply ends);
- ``next``: seconds to the normal message's reply, on the same process;
- ``restart``: what the restarted process does within ``--restart-wait`` seconds: exits
  (its code and when, from its start) or stays up; and whether the attack's reply has
  then ended.

``--stream`` runs the second attack instead: an openai-responses stream of 40,000
citations (closing events of ~11 MB each), progress writes off.

``--chunk-cost`` measures what the checks before each push cost on the hot path
instead: one small text delta (an OpenAI chat chunk) through the built-in ``openai``
adapter's ``StreamSession.chunk``, in batches of 10,000, in a fresh process per tree.

"before" is ``gelbridge/`` and ``adapters/`` of ``--before`` (default: the commit before
the first fix on main, ``bcaa7fb^``), "after" the working tree; the two trees' runs
alternate. Medians over ``--runs``.

Run: ``.venv/bin/python scripts/bench_oversized_request.py [--runs=3] [--stream | --chunk-cost] [--before=REV]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if "--chunk-child" not in sys.argv:  # a child imports the tree on its PYTHONPATH
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

MiB = 1024 * 1024
WAIT = 180.0


def export_tree(rev: str, into: Path) -> Path:
    """``gelbridge/`` and the built-in ``adapters/`` of ``rev`` under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gelbridge", "adapters"], check=True,
                             capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    return into


class Worker:
    """``python -m gelbridge run`` importing ``tree`` (run in ``cwd``, which holds no package)."""

    def __init__(self, tree: Path, cfg: Path, app_password: str, log: Path) -> None:
        from integration.conftest import PASSWORD_ENV

        self.env = {**os.environ, "PYTHONPATH": str(tree), PASSWORD_ENV: app_password}
        self.env.pop("GELBRIDGE_CONFIG", None)
        self.cfg, self.log, self.tree = cfg, log, tree
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.peak_kb = 0

    def check_import(self) -> None:
        out = subprocess.run([sys.executable, "-c", "import gelbridge; print(gelbridge.__file__)"], env=self.env,
                             cwd=self.cfg.parent, capture_output=True, text=True, timeout=60).stdout.strip()
        if not out.startswith(str(self.tree)):
            raise SystemExit(f"the worker would import {out}, not the tree {self.tree}")

    def start(self) -> None:
        out = self.log.with_suffix(".out")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gelbridge", "run", "--config", str(self.cfg), "--log-level", "info"],
            stdout=open(out, "wb"), stderr=open(self.log, "ab"), env=self.env, cwd=self.cfg.parent,
            start_new_session=True)
        self.started = time.monotonic()
        deadline = self.started + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None or b"ready:" in out.read_bytes():
                return
            time.sleep(0.1)
        raise SystemExit(f"worker not ready in time; see {self.log}")

    @property
    def code(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def sample(self) -> None:
        assert self.proc is not None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))
        except (OSError, ValueError):
            pass

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.poll() if self.proc is not None else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


async def until_final(app: Any, worker: Worker, rkey: str, timeout: float = WAIT) -> tuple[str, float]:
    """(the reply's final status, or "exit"/"timeout"; seconds), sampling the worker's RSS."""
    t0 = time.monotonic()
    next_read = t0
    while time.monotonic() - t0 < timeout:
        worker.sample()
        if worker.code is not None:
            return "exit", time.monotonic() - t0
        if time.monotonic() >= next_read:
            got = await app.reply(rkey)
            if got is not None and got[0].status in ("complete", "error"):
                return str(got[0].status), time.monotonic() - t0
            next_read = time.monotonic() + 0.2
        await asyncio.sleep(0.05)
    return "timeout", time.monotonic() - t0


async def send_attack(app: Any, stream: bool, server: Any) -> str:
    from gelbridge._dev.model_server import Citation, Turn
    from gelbridge._records import MESSAGE_COLLECTION, PlainContent, new_tid, now_datetime
    from gelbridge._sealing import seal_blob, seal_content

    if stream:
        server.enqueue(Turn(text="Here is what the web says.", searches=["everything"], chunk_size=8, citations=[
            Citation(f"https://pages.example/{'section/' * 16}page-{i:05d}?ref=search&lang=en",
                     f"Page {i:05d} of the search results, a title of some length") for i in range(40_000)]))
        return str(await app.send("tell me everything", conversation=new_tid(),
                                  generation={"attempt": 0, "model": {"provider": "oai", "id": "gpt-5"}}))
    server.enqueue(Turn(text="I read them."))
    blob = await app.pds.upload_blob(seal_blob((b"x" * 1023 + b"\n") * 1024, key_id=app.key_id, keyring=app.keyring),
                                     "text/plain")
    parts = [{"$type": "chat.gel.assistant.defs#filePart", "name": f"f{i}.txt", "file": blob,
              "extracted": {"text": blob, "method": "text"}} for i in range(100)]
    rkey = new_tid()
    content = seal_content(PlainContent.model_validate({"$type": "chat.gel.assistant.defs#plainContent", "parts": [
        {"$type": "chat.gel.assistant.defs#textPart", "text": "read these"}, *parts]}), uri=app.uri(rkey), key_id=app.key_id,
        keyring=app.keyring).to_value()
    content["blobs"] = [blob]
    await app.pds.put_record(MESSAGE_COLLECTION, rkey, {
        "$type": MESSAGE_COLLECTION, "conversation": new_tid(), "role": "user", "content": content,
        "generation": {"attempt": 0}, "createdAt": now_datetime()})
    return rkey


async def one_run(tree: Path, pds_url: str, tmp: Path, stream: bool, restart_wait: float) -> dict[str, Any]:
    from integration.conftest import App
    from integration.worker_proc import write_config

    from gelbridge._dev.model_server import ModelServer
    from gelbridge._dev.pds import create_account
    from gelbridge._pds import PdsClient
    from gelbridge._records import new_tid
    from gelbridge._sealing import Keyring

    tmp.mkdir(parents=True, exist_ok=True)
    account = create_account(pds_url, f"ov{secrets.token_hex(4)}.test", secrets.token_urlsafe(12))
    keyring = Keyring()
    key_id = keyring.add_new("k-bench")
    out: dict[str, Any] = {}
    with ModelServer() as server:
        extra = f'\n[providers.oai]\nadapter = "openai-responses"\nbase_url = "{server.url}/v1"\nmax_retries = 0\n'
        cfg = write_config(tmp, pds_url, account, server.url, keyring, 0.0 if stream else 0.2,
                           extra=extra if stream else "")
        async with PdsClient(pds_url) as pds:
            await pds.login(account.handle, account.password)
            app = App(pds, keyring, key_id)
            w = Worker(tree, cfg, account.app_password, tmp / "worker1.log")
            w.check_import()
            w.start()
            k = await send_attack(app, stream, server)
            out["attack"], out["attack_s"] = await until_final(app, w, f"{k}.r0")
            out["code"], out["peak_mib"] = w.code, w.peak_kb / 1024
            if w.code is None:
                k2 = await app.send("a normal question", conversation=new_tid())
                out["next"], out["next_s"] = await until_final(app, w, f"{k2}.r0")
            out["stop_code"] = w.stop()
            w2 = Worker(tree, cfg, account.app_password, tmp / "worker2.log")
            w2.start()
            end = time.monotonic() + restart_wait
            while time.monotonic() < end and w2.code is None:
                await asyncio.sleep(0.1)
            out["restart_code"] = w2.code
            out["restart_exit_s"] = time.monotonic() - w2.started if w2.code is not None else None
            got = await app.reply(f"{k}.r0")
            out["attack_final_after_restart"] = got[0].status if got is not None else None
            w2.stop()
    return out


def summary(name: str, runs: list[dict[str, Any]]) -> str:
    def med(key: str) -> str:
        vals = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        return f"{statistics.median(vals):.1f}" if vals else "-"

    codes = sorted({"running" if r["code"] is None else str(r["code"]) for r in runs})
    restart = sorted({"running" if r["restart_code"] is None else f"exit {r['restart_code']}" for r in runs})
    return (f"{name:<7} attack reply {sorted({r['attack'] for r in runs})} after {med('attack_s')} s, process "
            f"{codes}, RSS peak {med('peak_mib')} MiB; next message {sorted({r.get('next', '-') for r in runs})} "
            f"after {med('next_s')} s; restart: {restart} (exit {med('restart_exit_s')} s after start), attack "
            f"reply then {sorted({str(r['attack_final_after_restart']) for r in runs})}")


CHUNK = '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hello "}}]}'


def chunk_child() -> None:
    """Microseconds per chunk, median over batches (whichever ``gelbridge`` is on the path)."""
    import json

    import gelbridge
    from gelbridge._adapters.host import load_adapter
    from gelbridge._adapters.sandbox import SandboxLimits

    tree = Path(gelbridge.__file__).parent.parent
    a = load_adapter(tree / "adapters" / "openai.lua", limits=SandboxLimits(), allow_hosts={})
    per: list[float] = []
    with a.stream_session() as s:
        step = s.chunk
        for _ in range(2_000):
            step(CHUNK)
        for _ in range(30):
            t = time.perf_counter()
            for _ in range(10_000):
                step(CHUNK)
            per.append((time.perf_counter() - t) / 10_000 * 1e6)
    print(json.dumps({"gelbridge": gelbridge.__file__, "us": statistics.median(per)}))


def chunk_cost(trees: dict[str, Path], runs: int) -> None:
    import json

    got: dict[str, list[float]] = {name: [] for name in trees}
    for i in range(runs):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, __file__, "--chunk-child"], env={**os.environ, "PYTHONPATH": str(tree)},
                                 cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=600, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if not r["gelbridge"].startswith(str(tree)):
                raise SystemExit(f"imported {r['gelbridge']}, not the tree {tree}")
            got[name].append(r["us"])
            print(f"  run {i} {name:<6} {r['us']:.2f} us per chunk", flush=True)
    for name, vals in got.items():
        print(f"{name:<7} median {statistics.median(vals):.2f} us per chunk over {runs} process(es)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stream", action="store_true", help="the 40,000-citation stream instead of the 100 file parts")
    ap.add_argument("--before", default="bcaa7fb^", help="the revision before the fix")
    ap.add_argument("--restart-wait", type=float, default=20.0, help="seconds the restarted process is watched")
    ap.add_argument("--chunk-cost", action="store_true", help="the per-chunk cost of the push checks instead")
    ap.add_argument("--chunk-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.chunk_child:
        chunk_child()
        return

    tmp = Path(tempfile.mkdtemp(prefix="gelbridge-bench-oversized-"))
    trees = {"before": export_tree(args.before, tmp / "before"), "after": ROOT}
    if args.chunk_cost:
        print(f"stream chunk cost: before = {args.before}, after = the working tree", flush=True)
        chunk_cost(trees, args.runs)
        return

    from gelbridge._dev.pds import DevPds

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    what = "40,000-citation stream" if args.stream else "100 file parts naming one 1 MiB blob"
    print(f"oversized request ({what}): {args.runs} run(s) per tree; before = {args.before}, after = the working "
          f"tree; logs in {tmp}", flush=True)
    t0 = time.monotonic()
    with DevPds() as pds:
        for i in range(args.runs):
            for name, tree in trees.items():
                r = asyncio.run(one_run(tree, pds.pds_url, tmp / f"{name}-{i}", args.stream, args.restart_wait))
                results[name].append(r)
                print(f"  run {i} {name:<6} {r}", flush=True)
    print()
    for name, runs in results.items():
        print(summary(name, runs))
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
