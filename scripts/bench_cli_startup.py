"""``gelbridge`` commands as whole processes, before and after a change, side by side.

Exports ``--before`` (a commit; default 4d275e2, before issue 22's lazy imports) with
``git archive`` into a temporary directory, then runs each command ``--runs`` times from
that tree and from this one, alternating (before, after, then after, before, ...), each
a fresh interpreter running what the console script runs (``from gelbridge._cli import
main; main()``) with ``PYTHONPATH`` at its tree and the working directory elsewhere.
Prints the median wall time and quartiles of each, next to the bare interpreter
(``python -c pass``), then the median import time of each (the top-level imports of
``python -X importtime``, ``--import-runs`` runs).

Commands: ``--help``; ``open`` and ``convert`` on examples/conversation; ``reply`` on it
against the local model server's echo model (started here); ``check`` logging in to a
throw-away account on a local reference PDS (started here; ``--no-check`` skips it).
Every run must exit 0.

    .venv/bin/python scripts/bench_cli_startup.py [--before REF] [--runs 15] [--import-runs 5] [--no-check]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from gelbridge._dev.model_server import ModelServer

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "conversation"
RECORDS = EXAMPLE / "records.json"
KEYRING = EXAMPLE / "keyring.json"
MESSAGE = "3mbd36vbls22b"
MAIN = "from gelbridge._cli import main; main()"


def export_tree(ref: str, into: Path) -> Path:
    """The files of commit ``ref`` under ``into`` (no worktree, nothing left in the repo)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def commands(work: Path, model_url: str, pds: tuple[str, str] | None) -> dict[str, list[str]]:
    reply_cfg = work / "reply.toml"
    reply_cfg.write_text(f'[providers.openai]\nadapter = "openai"\nbase_url = "{model_url}/v1"\n'
                         'api_key_env = "BENCH_MODEL_KEY"\n')
    cmds = {
        "--help": ["--help"],
        "open": ["open", "--keyring", str(KEYRING), str(RECORDS)],
        "convert": ["convert", "--keyring", str(KEYRING), "--message", MESSAGE, str(RECORDS)],
        "reply": ["reply", "--keyring", str(KEYRING), "--config", str(reply_cfg), "--message", MESSAGE,
                  str(RECORDS)],
    }
    if pds is not None:
        url, handle = pds
        check_cfg = work / "check.toml"
        check_cfg.write_text(f'[account]\nidentifier = "{handle}"\npds = "{url}"\npassword_env = "BENCH_PASSWORD"\n\n'
                             f'[keyring]\npath = "{KEYRING}"\n\n[state]\ndir = "{work / "state"}"\n\n'
                             f'[providers.openai]\nadapter = "openai"\nbase_url = "{model_url}/v1"\n'
                             'api_key_env = "BENCH_MODEL_KEY"\n')
        cmds["check"] = ["check", "--config", str(check_cfg)]
    return cmds


def run_once(tree: Path | None, args: list[str], env: dict[str, str], cwd: Path, *,
             importtime: bool = False) -> float:
    """Wall seconds of one process (or, with ``importtime``, its total import seconds)."""
    code = MAIN if tree is not None else "pass"
    environ = dict(env, PYTHONPATH=str(tree)) if tree is not None else env
    flags = ["-X", "importtime"] if importtime else []
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *flags, "-c", code, *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")][-5:]
        raise SystemExit(f"gelbridge {' '.join(args)} exited {proc.returncode} ({tree}):\n" + "\n".join(tail))
    if not importtime:
        return wall
    total_us = 0
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line[len("import time:"):].split("|")
            if name.startswith(" ") and not name.startswith("  ") and cumulative.strip().isdigit():
                total_us += int(cumulative)  # a top-level import: its whole tree
    return total_us / 1e6


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="4d275e2", help="commit to compare with (default: 4d275e2)")
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command and tree (default 15)")
    parser.add_argument("--import-runs", type=int, default=5, help="-X importtime runs per command and tree")
    parser.add_argument("--no-check", action="store_true", help="skip 'check' (it starts a local PDS)")
    args = parser.parse_args()

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cli-")))
        (work / "before").mkdir()
        (work / "cwd").mkdir()
        cwd = work / "cwd"  # neither tree: python -c puts the working directory first on sys.path
        trees = {"before": export_tree(args.before, work / "before"), "after": REPO}
        model = stack.enter_context(ModelServer(api_key="sk-bench"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GELBRIDGE_", "PYTHON"))}
        env["BENCH_MODEL_KEY"] = "sk-bench"
        pds = None
        if not args.no_check:
            from gelbridge._dev.pds import DevPds, create_account

            dev = DevPds()
            dev.start(timeout=180)
            stack.callback(dev.stop)
            account = create_account(dev.pds_url, f"bench{secrets.token_hex(3)}.test", secrets.token_urlsafe(12))
            env["BENCH_PASSWORD"] = account.app_password
            pds = (dev.pds_url, account.handle)
        cmds = commands(work, model.url, pds)

        for argv in cmds.values():  # warm-up: .pyc files written, caches filled, both trees
            for tree in trees.values():
                run_once(tree, argv, env, cwd)
        bare = [run_once(None, [], env, cwd) for _ in range(args.runs)]
        wall: dict[tuple[str, str], list[float]] = {(c, t): [] for c in cmds for t in trees}
        for i in range(args.runs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for name, argv in cmds.items():
                for label in order:
                    wall[name, label].append(run_once(trees[label], argv, env, cwd))
        imports: dict[tuple[str, str], list[float]] = {(c, t): [] for c in cmds for t in trees}
        for i in range(args.import_runs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for name, argv in cmds.items():
                for label in order:
                    imports[name, label].append(run_once(trees[label], argv, env, cwd, importtime=True))

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"whole process, median of {args.runs} (quartiles), before = {args.before}, after = this tree; "
          f"bare interpreter {statistics.median(bare) * 1000:.0f} ms; load average at the end {load}")
    print()
    print("| command | before | after | saved | imports before | imports after |")
    print("|---|---|---|---|---|---|")
    for name in cmds:
        b = quartiles(wall[name, "before"])
        a = quartiles(wall[name, "after"])
        ib = statistics.median(imports[name, "before"])
        ia = statistics.median(imports[name, "after"])
        print(f"| `{name}` | {b[1] * 1000:.0f} ms ({b[0] * 1000:.0f}–{b[2] * 1000:.0f}) "
              f"| {a[1] * 1000:.0f} ms ({a[0] * 1000:.0f}–{a[2] * 1000:.0f}) "
              f"| {(b[1] - a[1]) * 1000:.0f} ms ({1 - a[1] / b[1]:.0%}) | {ib * 1000:.0f} ms | {ia * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
