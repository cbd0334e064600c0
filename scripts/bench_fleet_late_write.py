"""The late write after a fleet takeover (issue 23, point 3), re-run before and after the fix.

Each run is ``tests/integration/late_write.py`` on the real local PDS and PostgreSQL:
worker A's first progress write is held in a TCP proxy while A's lease runs out, worker
B takes the lease and resumes the reply (reading the record), and A's write is let go
``release`` seconds after B took the reply over, with B's model answering at once: the
attack as it happens, so a run is caught only when A's write lands between B's read
and B's first write. Run ``i`` of ``--runs`` releases after ``i * --step`` seconds, the
same delays for both trees, and the two trees' runs alternate (side by side in one run).

Reported per tree: runs whose reply was left unfinished (stuck at ``streaming``, 20 s
after the release), runs in which A's write landed (HTTP 200) after B's read, the
claims' ends, and the median seconds from the release to the reply's final status.

"before" is ``gelbridge/`` (and ``adapters/``) of ``git merge-base HEAD main`` (or ``--before=REV``), "after"
the working tree; the harness (tests/) is the working tree's for both.

Run: ``.venv/bin/python scripts/bench_fleet_late_write.py [--runs=8] [--step=0.1] [--before=REV]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def export_tree(rev: str, into: Path) -> Path:
    """``gelbridge/`` and the built-in ``adapters/`` of ``rev`` under ``into`` (tests/ stays
    the working tree's)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gelbridge", "adapters"], check=True,
                             capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    return into


async def child(args: argparse.Namespace) -> None:
    """One run in this process, with whichever ``gelbridge`` is first on the path."""
    import logging

    import gelbridge
    from gelbridge._dev.pds import create_account
    from gelbridge._records import new_tid
    from tests.integration.late_write import late_write

    logging.basicConfig(level=logging.WARNING, filename=args.log, format="%(name)s %(levelname)s %(message)s")
    tmp = Path(args.tmp)
    account = create_account(args.pds, f"lw{new_tid()[-8:]}.test", f"pw-{new_tid()}")
    run = await late_write(tmp, args.pds, args.postgres, account, release_after=args.release)
    print(json.dumps({"gelbridge": gelbridge.__file__, "status": run.status, "claim": run.claim,
                      "landed_late": run.landed_late, "seconds": run.seconds, "replies": run.replies,
                      "outcomes": run.outcomes, "stuck": run.stuck}))


def one_run(tree: Path, pds_url: str, db_url: str, release: float, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
    tmp.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--pds", pds_url, "--postgres", db_url, "--release", str(release),
         "--tmp", str(tmp), "--log", str(tmp / "run.log")],
        env=env, capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1:] or ["?"], "stuck": None}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["gelbridge"].startswith(str(tree)):
        raise SystemExit(f"run imported {result['gelbridge']}, not the tree {tree}")
    return result


def summary(name: str, runs: list[dict[str, Any]]) -> str:
    done = [r for r in runs if r.get("stuck") is not None]
    stuck = sum(1 for r in done if r["stuck"])
    late = sum(1 for r in done if r["landed_late"])
    secs = [r["seconds"] for r in done if r["seconds"] is not None]
    med = f"{statistics.median(secs):.2f} s" if secs else "-"
    claims = Counter("/".join(str(x) for x in r["claim"]) if r["claim"] else "none" for r in done)
    failed = len(runs) - len(done)
    return (f"{name:<7} stuck {stuck}/{len(done)}   A's late write landed {late}/{len(done)}   "
            f"release→final median {med}   claims {dict(claims)}" + (f"   harness failures {failed}" if failed else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--step", type=float, default=0.1, help="seconds between the release delays of two runs")
    ap.add_argument("--before", default=None, help="the revision before the fix (default: merge-base with main)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pds", help=argparse.SUPPRESS)
    ap.add_argument("--postgres", help=argparse.SUPPRESS)
    ap.add_argument("--release", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(child(args))
        return

    from gelbridge._dev.pds import DevPds
    from gelbridge._dev.postgres import DevPostgres

    before = args.before or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                           capture_output=True, text=True, timeout=30).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="gelbridge-bench-late-write-"))
    trees = {"before": export_tree(before, tmp / "before"), "after": ROOT}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    print(f"late write after a fleet takeover: {args.runs} runs per tree, release after 0..{(args.runs - 1) * args.step:.2f} s"
          f" (step {args.step:g} s); before = {before[:12]}, after = the working tree; logs in {tmp}")
    t0 = time.monotonic()
    with DevPds() as pds, DevPostgres() as pg:
        for i in range(args.runs):
            release = round(i * args.step, 3)
            for name, tree in trees.items():
                db = pg.create_database(f"late_{name}_{i}")
                r = one_run(tree, pds.pds_url, db, release, tmp / f"{name}-{i}")
                results[name].append(r)
                what = "harness failed: " + " ".join(r["failed"]) if "failed" in r else (
                    f"{'STUCK' if r['stuck'] else r['status']:<9} claim {r['claim']} landed_late={r['landed_late']}")
                print(f"  run {i} release {release:.2f} s  {name:<6} {what}", flush=True)
    print()
    for name, runs in results.items():
        print(summary(name, runs))
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
