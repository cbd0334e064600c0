"""``gelbridge convert`` and the worker's thread rebuild on one long chain, by chain length.

Run: ``.venv/bin/python scripts/bench_thread.py [--sizes=1000,3000,10000] [--repeats=3]
[--before=/work/main] [--limit=600]``.

For each size N a record file holds one conversation of N - 1 sealed messages (user,
reply, user, ...: the last is a user message asking for a reply; N = 10,000 gives the
9,999-record chain of issue 23) and a config sets ``[thread] max_depth = 30000``. Two
timings per size, in fresh processes:

- ``convert``: ``cli.records.convert_file`` on the file (the worker's own turn offline,
  up to its first model call: load, walk, open, map);
- ``rebuild``: ``worker.repo.load_thread`` of the last message with an empty record
  cache over a repo that answers ``getRecord`` from memory (what a worker does after a
  restart, or once its LRU has dropped the thread). It also prints the ``getRecord``
  calls and thread walks it took.

With ``--before=DIR`` every measurement also runs with ``PYTHONPATH=DIR`` (another
checkout, e.g. main), alternating with this tree's, and both medians are printed side
by side. A super-linear step shows as time/N growing with N. A run that takes over
``--limit`` seconds (its process is killed then) shows as ``>limit`` and is
not repeated.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
DID = "did:plc:benchthread0000000000000"


def make_file(n: int, tmp: Path) -> tuple[Path, Path, Path, str]:
    """The record file, keyring and config of an (n - 1)-record chain; the last message's key."""
    from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
    from gelbridge._sealing import Keyring, seal_content

    ring = Keyring()
    kid = ring.add_new("k-bench")
    records: list[dict[str, Any]] = []
    parent: str | None = None
    user_key = ""
    for i in range(n - 1):
        user = i % 2 == 0
        rkey = new_tid() if user else f"{user_key}.r0"
        uri = AtUri(DID, MESSAGE_COLLECTION, rkey)
        content = seal_content(PlainContent(parts=[TextPart(text=f"message {i}")]), uri=uri, key_id=kid,
                               keyring=ring).to_value()
        value: dict[str, Any] = {"$type": MESSAGE_COLLECTION, "conversation": "3mbenchconv22", "content": content,
                                 "role": "user" if user else "assistant", "createdAt": now_datetime()}
        if parent is not None:
            value["parent"] = parent
        if user:
            value["generation"] = {"attempt": 0}
            user_key = rkey
        else:
            value["status"] = "complete"
        records.append({"uri": str(uri), "cid": None, "value": value})
        parent = rkey
    path, keyring, config = tmp / f"chain-{n}.json", tmp / "keyring.json", tmp / "config.toml"
    path.write_text(json.dumps({"records": records}))
    ring.save(keyring)
    config.write_text('[thread]\nmax_depth = 30000\n\n[defaults]\nmodel = { provider = "local", id = "m" }\n\n'
                      '[providers.local]\nadapter = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n')
    return path, keyring, config, user_key


# --- child: one measurement, printed as JSON -----------------------------------------------------


def child(what: str, path: str, keyring: str, config: str, message: str) -> None:
    from gelbridge._config import load_config
    from gelbridge._sealing import Keyring

    settings = load_config(Path(config))
    ring = Keyring.load(Path(keyring))
    out: dict[str, Any]
    if what == "convert":
        from gelbridge._cli.records import convert_file

        t0 = time.perf_counter()
        result = convert_file(Path(path), ring, message, settings)
        out = {"s": time.perf_counter() - t0, "items": len(result.request.conversation)}
    else:
        out = _rebuild(Path(path), message, settings.thread.max_depth)
    print(json.dumps(out))


def _rebuild(path: Path, message: str, max_depth: int) -> dict[str, Any]:
    import asyncio

    from gelbridge import _thread
    from gelbridge._mapping.cache import OpenedRecordCache
    from gelbridge._records.io import load_records
    from gelbridge._worker import repo as worker_repo

    values = {e.uri.rkey: (e.cid or "bafy", e.value) for e in load_records(path)}

    class Memory:
        gets = 0

        async def get_record(self, collection: str, rkey: str, **_: Any) -> tuple[str, dict[str, Any]] | None:
            Memory.gets += 1
            return values.get(rkey)

        async def sync_get_record(self, *a: Any, **k: Any) -> None:
            return None

    walks = 0
    real_walk = _thread.walk_thread

    def counted(*a: Any, **k: Any) -> Any:
        nonlocal walks
        walks += 1
        return real_walk(*a, **k)

    worker_repo.walk_thread = counted  # type: ignore[attr-defined]
    view = worker_repo.RepoView(Memory(), DID)  # type: ignore[arg-type]  # the worker's sizes
    cache = OpenedRecordCache()

    async def timed() -> tuple[float, int]:
        t0 = time.perf_counter()
        thread, _ = await worker_repo.load_thread(view, message, cache, max_depth=max_depth)
        return time.perf_counter() - t0, len(thread)

    took, records = asyncio.run(timed())
    return {"s": took, "records": records, "gets": Memory.gets, "walks": walks}


# --- parent: files, runs, table ----------------------------------------------------------------------


def run(pythonpath: Path, what: str, args: list[str], limit: float) -> dict[str, Any]:
    """One measurement in a fresh process; ``{"s": inf}`` when it takes over ``limit`` seconds."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    try:
        got = subprocess.run([sys.executable, __file__, "--child", what, *args], env=env, capture_output=True,
                             text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return {"s": float("inf"), "gets": "?", "walks": "?"}
    if got.returncode != 0:
        raise SystemExit(f"{what} under {pythonpath} failed:\n{got.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    sizes, repeats, before, limit = [1000, 3000, 10000], 3, None, 600.0
    for arg in sys.argv[1:]:
        if arg.startswith("--sizes="):
            sizes = [int(x) for x in arg.split("=", 1)[1].split(",")]
        elif arg.startswith("--repeats="):
            repeats = int(arg.split("=", 1)[1])
        elif arg.startswith("--before="):
            before = Path(arg.split("=", 1)[1]).resolve()
        elif arg.startswith("--limit="):
            limit = float(arg.split("=", 1)[1])
    trees = ([("before", before)] if before is not None else []) + [("after", HERE)]
    print(f"{'step':>8} {'records':>8} " + " ".join(f"{label + ' s':>10} {label + ' µs/rec':>13}" for label, _ in trees)
          + f"  (median of {repeats}; rebuild: getRecord calls / walks)")
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            path, keyring, config, message = make_file(n, Path(d))
            args = [str(path), str(keyring), str(config), message]
            for what in ("convert", "rebuild"):
                times: dict[str, list[float]] = {label: [] for label, _ in trees}
                extra: dict[str, str] = {}
                for _ in range(repeats):
                    for label, tree in trees:
                        if times[label] and times[label][-1] == float("inf"):
                            continue  # over the limit once: not again
                        got = run(tree, what, args, limit)
                        times[label].append(got["s"])
                        if what == "rebuild":
                            extra[label] = f"{got['gets']}/{got['walks']}"
                cells = []
                for label, _ in trees:
                    med = statistics.median(times[label])
                    cells.append(f"{med:>10.3f} {med / (n - 1) * 1e6:>13.1f}" if med != float("inf")
                                 else f"{'>' + format(limit, 'g'):>10} {'-':>13}")
                note = "  " + " vs ".join(f"{k}: {v}" for k, v in extra.items()) if extra else ""
                print(f"{what:>8} {n - 1:>8} " + " ".join(cells) + note, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:7])
    else:
        main()
