"""Health, readiness and metrics of a running worker on the real local PDS: /healthz,
/readyz and /metrics answer; the metrics parse with prometheus_client's own parser and
move after a turn; labels hold account names and gelbridge's own words only."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._observability import JsonFormatter
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring

from .conftest import PASSWORD_ENV, App, http_of, make_settings, running_worker, source_of
from .worker_proc import WorkerProc, write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_a_running_worker_answers_healthz_readyz_and_metrics_that_move_after_a_turn(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             observability={"listen": "127.0.0.1:0"})
    secret = "secret-canary-7d1"
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        deadline = time.monotonic() + 30
        while http_of(worker) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        host, port = http_of(worker).sockets[0].getsockname()[:2]
        base = f"http://{host}:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/healthz")).status_code == 200
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.text == "ready\n"
            before = samples((await http.get("/metrics")).text)
            model_server.enqueue(Turn(text=f"an answer with {secret}"))
            k = await app.send(f"a question with {secret}", conversation=new_tid())
            await app.wait_status(f"{k}.r0", "complete", timeout=60)
            await worker.wait_idle(10)
            page = (await http.get("/metrics")).text
            after = samples(page)
            assert (await http.get("/nope")).status_code == 404
            source_of(worker).connected.clear()  # as while the firehose reconnects
            assert (await http.get("/readyz")).status_code == 503
            source_of(worker).connected.set()
    acct = (("account", pds_account.handle),)
    assert after[("gelbridge_turns_total", (*acct, ("status", "complete")))] == 1
    assert before.get(("gelbridge_turns_total", (*acct, ("status", "complete"))), 0) == 0
    assert after[("gelbridge_pds_write_points_total", acct)] >= 4  # claim + final, 2 points each
    assert after[("gelbridge_bridge_overhead_ms_count", acct)] == 1
    assert after[("gelbridge_model_latency_seconds_count", acct)] == 1
    assert after[("gelbridge_turn_latency_seconds_count", acct)] == 1  # commit seen -> final write
    assert 0 < after[("gelbridge_turn_latency_seconds_sum", acct)] < 60
    assert after[("gelbridge_model_output_tokens_total", acct)] > 0
    assert ("gelbridge_replies_in_flight", acct) in after and ("gelbridge_queue_depth", acct) in after
    assert secret not in page and "question" not in page


def test_json_logs_are_one_object_a_line_and_keep_no_exception_text() -> None:
    fmt = JsonFormatter()
    rec = logging.LogRecord("gelbridge.x", logging.WARNING, __file__, 1, "reply %s failed (%s)", ("3mk.r0", "E"),
                            None)
    try:
        raise KeyError("sealed text")
    except KeyError:
        import sys

        rec2 = logging.LogRecord("gelbridge.y", logging.ERROR, __file__, 2, "boom", (), sys.exc_info())
    for r in (rec, rec2):
        line = fmt.format(r)
        assert "\n" not in line
        obj = json.loads(line)
        assert set(obj) >= {"ts", "level", "logger", "message"} and obj["ts"].endswith("Z")
    assert json.loads(fmt.format(rec))["message"] == "reply 3mk.r0 failed (E)"
    assert "sealed text" not in fmt.format(rec2) and json.loads(fmt.format(rec2))["error"] == "KeyError"


async def test_a_bridge_of_two_accounts_answers_readyz_and_metrics_per_account_and_status_shows_both(
    dev_pds: DevPds, tmp_path: Path,
) -> None:
    """``[[accounts]]`` (the Bridge, as ``gelbridge run`` starts it): /readyz waits for
    every account's source, /metrics labels turns and points by account name, and
    ``gelbridge status`` lists both accounts with the points their turns spent."""
    import secrets

    from typer.testing import CliRunner

    from gelbridge._bridge import Bridge
    from gelbridge._cli import app as cli
    from gelbridge._config import load_config
    from gelbridge._dev.pds import create_account
    from gelbridge._pds import PdsClient

    accts = {n: create_account(dev_pds.pds_url, f"ob{secrets.token_hex(5)}.test", secrets.token_urlsafe(12))
             for n in ("a", "b")}
    rings = {n: Keyring() for n in accts}
    kids = {n: rings[n].add_new(f"k-{n}") for n in accts}
    for n in accts:
        rings[n].save(tmp_path / f"{n}.keyring.json")
    with ModelServer() as model:
        cfg = tmp_path / "gelbridge.toml"
        cfg.write_text("\n".join([
            f'[state]\ndir = "{tmp_path / "state"}"',
            '[observability]\nlisten = "127.0.0.1:0"',
            '[defaults]\nmodel = { provider = "local", id = "echo-1" }',
            f'[providers.local]\nadapter = "openai"\nbase_url = "{model.url}/v1"\nmax_retries = 0',
            "[replies]\nupdate_interval = 0.2",
            "[worker]\nshutdown_grace = 2.0",
            *(f'[[accounts]]\nname = "{n}"\npds = "{dev_pds.pds_url}"\nidentifier = "{a.handle}"\n'
              f'password_env = "PW_{n.upper()}"\nkeyring = "{tmp_path / f"{n}.keyring.json"}"'
              for n, a in accts.items()),
        ]) + "\n")
        settings = load_config(cfg)
        environ = {f"PW_{n.upper()}": a.app_password for n, a in accts.items()}
        stop = asyncio.Event()
        import io

        out, ready = io.StringIO(), asyncio.Event()
        bridge = Bridge(settings, environ=environ)  # what `gelbridge run` runs, for one account or many
        serving = asyncio.create_task(bridge.run(stop, ready=ready, out=out))
        try:
            await asyncio.wait_for(ready.wait(), 60)
            deadline = time.monotonic() + 30
            while getattr(bridge.watched, "http", None) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            host, port = bridge.watched.http.sockets[0].getsockname()[:2]
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
                for _ in range(300):  # until the firehose is open
                    ready = await http.get("/readyz")
                    if ready.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                assert ready.status_code == 200, ready.text
                for n, a in accts.items():
                    async with PdsClient(dev_pds.pds_url) as pc:
                        await pc.login(a.handle, a.password)
                        user = App(pc, rings[n], kids[n])
                        k = await user.send(f"hello from {n}", conversation=new_tid())
                        await user.wait_status(f"{k}.r0", "complete", timeout=60)
                for ctx in bridge.accounts.values():
                    await ctx.worker.wait_idle(10)
                page = (await http.get("/metrics")).text
                [src] = bridge.sources.values()
                src.connected.clear()  # as while the firehose reconnects
                waiting = await http.get("/readyz")
                src.connected.set()
        finally:
            stop.set()
            await asyncio.wait_for(serving, 20)
    printed = out.getvalue()
    for a in accts.values():  # each account's start-up lines and backfill, then one "ready"
        assert f"gelbridge worker for {a.handle}" in printed
    assert printed.count("  backfill   ") == 2 and printed.count("ready: answering messages") == 1
    got = samples(page)
    [name] = bridge.sources
    for n in accts:
        assert got[("gelbridge_turns_total", (("account", n), ("status", "complete")))] == 1
        assert got[("gelbridge_pds_write_points_total", (("account", n),))] >= 4  # claim + final
    assert got[("gelbridge_source_connected", (("source", name),))] == 1
    assert waiting.status_code == 503 and "a: source not connected" in waiting.text and "b:" in waiting.text
    assert "hello" not in page

    res = await asyncio.to_thread(CliRunner().invoke, cli, ["status", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    by_name = {a["name"]: a for a in rep["accounts"]}
    assert set(by_name) == {"a", "b"}
    for n, a in accts.items():
        assert by_name[n]["handle"] == a.handle and by_name[n]["points"]["last_hour"] >= 4
        assert [t["status"] for t in by_name[n]["turns"]] == ["complete"] and by_name[n]["turns"][0]["points"] >= 4
        assert isinstance(by_name[n]["cursor"], int)  # the one firehose subscription's cursor, both DIDs
    text = (await asyncio.to_thread(CliRunner().invoke, cli, ["status", "--config", str(cfg)])).output
    assert "account   a: " in text and "account   b: " in text and "in the last hour" in text


async def test_run_with_json_logs_writes_every_line_as_one_object_with_the_turn_timings_as_fields(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    """``gelbridge run`` with ``[logging] format = "json"``, a real process: its start-up
    lines, "ready", every log line, the turn line and the SIGTERM notice are each one JSON
    object, on the streams the text format uses; the turn's numbers are fields."""
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0],
                       extra='\n[logging]\nformat = "json"\n\n[observability]\nlisten = "127.0.0.1:0"\n')
    log = tmp_path / "worker.log"
    worker = WorkerProc(cfg, pds_account, log)
    try:
        await asyncio.to_thread(worker.start, 90)
        model_server.enqueue(Turn(text="an answer"))
        k = await app.send("a question", conversation=new_tid())
        await app.wait_status(f"{k}.r0", "complete", timeout=60)
        deadline = time.monotonic() + 20
        while f'"turn {k}.r0 complete"' not in log.read_text() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(worker.terminate) == 0
    finally:
        worker.stop()
    out = [json.loads(line) for line in worker.stdout.splitlines()]  # each line parses, or this fails
    err = [json.loads(line) for line in log.read_text().splitlines()]
    for obj in out + err:
        assert isinstance(obj, dict) and {"ts", "level", "logger", "message"} <= set(obj), obj
    said = [o["message"] for o in out]
    assert said[0] == f"gelbridge worker for {pds_account.handle} ({app.did})"
    assert f"PDS        {dev_pds.pds_url}" in said and said[-1] == "ready: answering messages (Ctrl-C to stop)"
    assert any(m.startswith("backfill   ") for m in said)
    [notice] = [o for o in err if o["message"].startswith("SIGTERM")]
    assert notice["message"] == "SIGTERM: stopping (grace 2 s)..." and notice["level"] == "warning"
    [turn] = [o for o in err if o["message"] == f"turn {k}.r0 complete"]
    assert turn["logger"] == "gelbridge.worker.turn" and turn["reply"] == f"{k}.r0" and turn["status"] == "complete"
    assert turn["account"] == pds_account.handle and turn["points"] >= 4
    stages = ("queue_ms", "read_ms", "bridge_ms", "model_ms", "write_ms")
    assert all(isinstance(turn[s], float | int) and turn[s] >= 0 for s in (*stages, "total_ms"))
    assert turn["total_ms"] == pytest.approx(sum(turn[s] for s in stages), abs=0.6)
    assert isinstance(turn["input_tokens"], int) and isinstance(turn["output_tokens"], int)
    assert any(o["message"].startswith("health and metrics on http://127.0.0.1:") for o in err)


async def test_a_taken_listen_port_stops_check_and_run_with_one_line_before_anything_is_opened(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0],
                           extra=f'\n[observability]\nlisten = "127.0.0.1:{port}"\n')
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")},
               PASSWORD_ENV: pds_account.app_password}
        for command in ("check", "run"):
            r = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "gelbridge", command, "--config", str(cfg)],
                capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
            assert r.returncode == 1, (command, r.stdout, r.stderr)
            assert (f"error: [observability] listen: 127.0.0.1:{port} is in use (another gelbridge? "
                    "pick another port)") in r.stderr.splitlines(), (command, r.stderr)
            assert "Traceback" not in r.stderr and "ready" not in r.stdout, (command, r.stderr)
    assert [x async for x in app.pds.iter_records("chat.gel.assistant.message")] == []
    assert not (tmp_path / "state").exists()  # nothing opened


async def test_start_up_lines_name_the_jetstream_url_and_wanted_dids_or_the_poll_interval(
    dev_pds: DevPds, tmp_path: Path,
) -> None:
    """What ``gelbridge run`` prints for each account says how it is followed: Jetstream's
    URL and the DIDs its one connection asks for, or the poll."""
    import io
    import secrets

    from gelbridge._bridge import Bridge
    from gelbridge._config import Settings
    from gelbridge._dev.pds import create_account
    from testkit.jetstream_server import JetstreamServer

    accts = {n: create_account(dev_pds.pds_url, f"js{secrets.token_hex(5)}.test", secrets.token_urlsafe(12))
             for n in ("a", "b")}
    for n in accts:
        ring = Keyring()
        ring.add_new(f"k-{n}")
        ring.save(tmp_path / f"{n}.keyring.json")
    environ = {f"PW_{n.upper()}": a.app_password for n, a in accts.items()}

    def settings(watch: dict[str, object], names: tuple[str, ...]) -> Settings:
        return Settings.model_validate({
            "state": {"dir": str(tmp_path / "state")},
            "watch": watch,
            "accounts": [{"name": n, "pds": dev_pds.pds_url, "identifier": accts[n].handle,
                          "password_env": f"PW_{n.upper()}", "keyring": str(tmp_path / f"{n}.keyring.json")}
                         for n in names],
            "providers": {"local": {"adapter": "openai", "base_url": "http://127.0.0.1:9/v1"}},
            "worker": {"shutdown_grace": 1.0},
        })

    async def printed(s: Settings) -> list[str]:
        out, ready, stop = io.StringIO(), asyncio.Event(), asyncio.Event()
        serving = asyncio.create_task(Bridge(s, environ=environ).run(stop, ready=ready, out=out))
        try:
            await asyncio.wait_for(ready.wait(), 60)
        finally:
            stop.set()
            await asyncio.wait_for(serving, 20)
        return [line for line in out.getvalue().splitlines() if line.startswith("  source")]

    async with JetstreamServer() as srv:
        lines = await printed(settings({"source": "jetstream", "url": srv.url}, ("a", "b")))
    dids = {n: accts[n].did for n in accts}
    cursor = "cursor none: starting live + backfill"
    assert lines == [f"  source     jetstream {srv.url} (wantedDids {dids[n]} and 1 other account(s); {cursor})"
                     for n in ("a", "b")]
    assert await printed(settings({"source": "poll", "poll_interval": 7}, ("a",))) == [
        "  source     poll every 7 s (listRecords on its PDS)"]
