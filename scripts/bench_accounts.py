"""Many accounts in one process (issue 24): per-account clients against the shared ones.

One ``Bridge`` serves ``--accounts`` accounts (default 200) of the local dev PDS, with one
stdio MCP server configured, the way ``gelbridge run`` does: log in (or resume), backfill,
follow the firehose, say ready. Two ways, side by side in one run, alternating:

- **per-account**: every account its own ``ModelClient`` (its adapters' Lua runtimes and
  connection pools) and its own MCP server process: what each worker did before
  (``SharedClients(share=False)``);
- **shared**: one model client and one MCP server process for all of them
  (``gelbridge._runtime.shared``, what ``gelbridge run`` does now).

Each measurement is a fresh process (so memory is its own), after one warm-up run that
logs the accounts in (the measured runs resume the saved sessions, as a restart does). Quoted: MCP child processes, resident memory of the process tree (RSS, and PSS,
which counts shared pages once), open file descriptors of the gelbridge process, and the
seconds from the start of ``Bridge.run`` to ``ready`` (every account served); medians
over ``--repeat`` runs (default 3).

The MCP server is a small stdlib one (this script with ``--mcp-server``: initialize,
tools/list, tools/call of one tool): it starts in ~20 ms, so 200 of them fit in the run.
A real server weighs more (the repo's SDK-based test server: ~1 s of CPU to start, ~35 MiB;
``--mcp sdk`` uses it, with fewer accounts).

Run: ``.venv/bin/python scripts/bench_accounts.py [--accounts 200] [--repeat 3] [--mcp tiny|sdk]``;
``--pds URL`` uses a running dev PDS (``gelbridge dev pds``) and keeps the accounts it
creates in ``--accounts-file`` (default ``/tmp/gelbridge-bench-accounts.json``) for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
SDK_SERVER = REPO / "tests" / "tools" / "mcp_test_server.py"


# --- the small MCP server (stdlib only: imported nothing else, it starts fast) ------------------


def mcp_server() -> None:
    """A stdio MCP server with one tool, ``now``: newline-delimited JSON-RPC."""
    tool = {"name": "now", "description": "The server's clock (seconds since the epoch).",
            "inputSchema": {"type": "object", "properties": {}}}
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue  # a notification (initialized, cancelled)
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": msg["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}},
                                      "serverInfo": {"name": "bench-tiny", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [tool]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": f"{time.time():.3f}"}], "isError": False}
        elif method == "ping":
            result = {}
        else:
            reply = {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"no method {method}"}}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
        sys.stdout.flush()


# --- /proc -------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += _children(p)
    return found


def _kib(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure_tree(pid: int) -> dict[str, float]:
    tree = _tree(pid)
    return {
        "children": len(_children(pid)),
        "rss_mib": sum(_kib(f"/proc/{p}/status", "VmRSS") for p in tree) / 1024,
        "pss_mib": sum(_kib(f"/proc/{p}/smaps_rollup", "Pss") for p in tree) / 1024,
        "own_rss_mib": _kib(f"/proc/{pid}/status", "VmRSS") / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


# --- one measured process ----------------------------------------------------------------------


def child(mode: str, config: Path) -> None:
    """Serve every account until ready, measure, stop; print one JSON line."""
    import asyncio
    import logging

    from gelbridge._bridge import Bridge
    from gelbridge._config import Settings
    from gelbridge._runtime.shared import SharedClients
    from gelbridge._sealing import Keyring

    logging.basicConfig(level=logging.ERROR)
    spec = json.loads(config.read_text())
    settings = Settings.model_validate(spec["settings"])
    keyrings = {}
    for entry in settings.accounts:
        kr = Keyring()
        kr.add_new("k")
        keyrings[entry.label] = kr

    async def main() -> dict[str, Any]:
        with open(os.devnull, "w") as errlog:
            pool = SharedClients(share=mode == "shared", errlog=errlog)
            bridge = Bridge(settings, environ=spec["environ"], keyrings=keyrings, shared=pool)
            stop, ready = asyncio.Event(), asyncio.Event()
            t0 = time.perf_counter()
            run = asyncio.create_task(bridge.run(stop, ready=ready))
            waiting = asyncio.create_task(ready.wait())
            await asyncio.wait({run, waiting}, timeout=600, return_when=asyncio.FIRST_COMPLETED)
            if not ready.is_set():
                waiting.cancel()
                if run.done():
                    run.result()  # raises what failed
                raise SystemExit("not ready within 600 s")
            startup = time.perf_counter() - t0
            await asyncio.sleep(1.0)  # let the start settle (backfill tails, firehose connect)
            got = measure_tree(os.getpid())
            got.update(startup_s=startup, accounts=len(bridge.accounts), **pool.counts())
            t1 = time.perf_counter()
            stop.set()
            await asyncio.wait_for(run, 120)
            await pool.aclose()
            got["shutdown_s"] = time.perf_counter() - t1
            return got

    print(json.dumps({"mode": mode, **asyncio.run(main())}), flush=True)


# --- the orchestration -------------------------------------------------------------------------


def make_accounts(pds_url: str, n: int, cache: Path | None) -> list[dict[str, str]]:
    """``n`` accounts on the PDS: from ``cache`` when they are there and still log in."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from gelbridge._dev.pds import create_account

    have: list[dict[str, str]] = []
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("pds") == pds_url:
            have = saved["accounts"][:n]
            if have:
                r = httpx.post(f"{pds_url}/xrpc/com.atproto.server.createSession", timeout=30,
                               json={"identifier": have[0]["handle"], "password": have[0]["password"]})
                if r.status_code != 200:
                    have = []
    tag = os.urandom(3).hex()

    def one(i: int) -> dict[str, str]:
        a = create_account(pds_url, f"ba{tag}{i}.test", f"pw-{tag}-{i}-bench")
        return {"handle": a.handle, "password": a.password, "app_password": a.app_password}

    missing = n - len(have)
    if missing > 0:
        print(f"creating {missing} accounts on {pds_url} ...", flush=True)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            have += list(ex.map(one, range(len(have), n)))
        print(f"  {missing} accounts in {time.perf_counter() - t0:.1f} s", flush=True)
    else:
        print(f"reusing {n} accounts from {cache}", flush=True)
    if cache is not None:
        cache.write_text(json.dumps({"pds": pds_url, "accounts": have}))
    return have


def write_config(path: Path, pds_url: str, accounts: list[dict[str, str]], state: Path, mcp: str) -> None:
    server = [sys.executable, str(HERE), "--mcp-server"] if mcp == "tiny" else [sys.executable, str(SDK_SERVER)]
    settings = {
        "state": {"dir": str(state)},
        "accounts": [{"name": f"acct{i}", "pds": pds_url, "identifier": a["handle"], "password_env": f"PW_{i}",
                      "state_dir": str(state)}  # one state store for all (as a fleet's Postgres is)
                     for i, a in enumerate(accounts)],
        "defaults": {"model": {"provider": "local", "id": "echo"}, "tools": ["mcp_bench_now"]},
        "providers": {"local": {"adapter": "openai", "base_url": "http://127.0.0.1:9/v1", "probe": False}},
        "mcp": {"servers": {"bench": {"command": server, "approval": "never", "startup_timeout": 120}}},
        "watch": {"source": "firehose"},
    }
    environ = {f"PW_{i}": a["app_password"] for i, a in enumerate(accounts)}
    path.write_text(json.dumps({"settings": settings, "environ": environ}))


def run_child(mode: str, config: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(HERE), "--child", mode, "--config", str(config)],
                          capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


FIELDS = [
    ("children", "MCP child processes", "{:.0f}"),
    ("rss_mib", "RSS of the process tree (MiB)", "{:.0f}"),
    ("pss_mib", "PSS of the process tree (MiB)", "{:.0f}"),
    ("own_rss_mib", "RSS of gelbridge alone (MiB)", "{:.0f}"),
    ("fds", "open file descriptors (gelbridge)", "{:.0f}"),
    ("startup_s", "start to ready, all served (s)", "{:.1f}"),
    ("shutdown_s", "stop (s)", "{:.1f}"),
    ("models", "model clients", "{:.0f}"),
    ("registries", "tool registries", "{:.0f}"),
]


def orchestrate(args: argparse.Namespace) -> None:
    import tempfile
    from contextlib import ExitStack

    from gelbridge._dev.pds import DevPds

    t_all = time.perf_counter()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="gelbridge-bench-accounts-") as tmp:
        pds_url = args.pds
        if pds_url is None:
            print("starting the dev PDS ...", flush=True)
            pds_url = stack.enter_context(DevPds()).pds_url
            cache = None
        else:
            cache = Path(args.accounts_file)
        accounts = make_accounts(pds_url.rstrip("/"), args.accounts, cache)
        config = Path(tmp) / "bench.json"
        write_config(config, pds_url.rstrip("/"), accounts, Path(tmp) / "state", args.mcp)
        results: dict[str, list[dict[str, Any]]] = {"per-account": [], "shared": []}
        runs = [("shared", "warm-up (logs in; not counted)")] + [
            (mode, f"run {rnd}/{args.repeat}") for rnd in range(1, args.repeat + 1)
            for mode in (("per-account", "shared") if rnd % 2 else ("shared", "per-account"))]
        for i, (mode, what) in enumerate(runs):
            t0 = time.perf_counter()
            got = run_child(mode, config)
            print(f"  {mode:12} {what}: ready in {got['startup_s']:.1f} s, {got['children']} MCP processes, "
                  f"RSS {got['rss_mib']:.0f} MiB, {got['fds']} fds ({time.perf_counter() - t0:.0f} s)", flush=True)
            if got["accounts"] != args.accounts:
                raise SystemExit(f"{mode}: {got['accounts']} of {args.accounts} accounts served")
            if i > 0:
                results[mode].append(got)
    print(f"\n{args.accounts} accounts, one stdio MCP server configured ({args.mcp}); medians of {args.repeat} "
          f"run(s), each a fresh process ({time.perf_counter() - t_all:.0f} s in all)\n")
    print(f"| {'':36} | per-account | shared |")
    print(f"|{'-' * 38}|------------:|-------:|")
    for key, label, fmt in FIELDS:
        a = statistics.median(r[key] for r in results["per-account"])
        b = statistics.median(r[key] for r in results["shared"])
        print(f"| {label:36} | {fmt.format(a):>11} | {fmt.format(b):>6} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accounts", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mcp", choices=["tiny", "sdk"], default="tiny")
    ap.add_argument("--pds", help="a running dev PDS (gelbridge dev pds); default: start one")
    ap.add_argument("--accounts-file", default="/tmp/gelbridge-bench-accounts.json")
    ap.add_argument("--mcp-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=["per-account", "shared"], help=argparse.SUPPRESS)
    ap.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mcp_server:
        mcp_server()
    elif args.child:
        child(args.child, args.config)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
