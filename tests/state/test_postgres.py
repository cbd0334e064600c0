"""The Postgres backend's own concerns: many worker processes writing at once, migrations
taken once under a lock, outages (one clear error, then a reconnect), no password or call
id in the clear. The store's rules on both backends are in test_store.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from gelbridge._config import load_config
from gelbridge._dev.pds import free_port
from gelbridge._errors import ConfigError, StateError
from gelbridge._state import CallRef, open_state
from gelbridge._state._postgres import SCHEMA_VERSION, PostgresStore, redacted

RACE = """
import asyncio, sys
from gelbridge._state import CallRef
from gelbridge._state._postgres import PostgresStore
async def main():
    s = await PostgresStore(sys.argv[1]).open()
    sys.stdin.readline()  # start together
    new = sum([(await s.begin_tool_call(CallRef("did:a", "conv", f"c{i}"), "m.r0", "t", "d")).new
               for i in range(100)])
    claims = [(await s.record_claim("did:a", f"m{i}", 0, f"m{i}.r0", "conv")).created_at for i in range(50)]
    print(new, len(set(claims)))
asyncio.run(main())
"""


async def test_worker_processes_racing_on_one_database_run_each_call_once(postgres_url: str) -> None:
    await (await PostgresStore(postgres_url).open()).aclose()  # migrated before the race
    procs = [subprocess.Popen([sys.executable, "-c", RACE, postgres_url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(1.0)  # all connected
    outs = [p.communicate("go\n", timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o[0]) for o in outs) == 100  # every call begun by exactly one process
    async with PostgresStore(postgres_url) as s:
        assert len(await s.unfinished_tool_calls("did:a")) == 100
        assert len(await s.unfinished_claims("did:a")) == 50  # one row per reply key, whoever came first


async def test_workers_starting_together_migrate_once(postgres_url: str) -> None:
    stores = await asyncio.gather(*(PostgresStore(postgres_url).open() for _ in range(4)))
    assert [await s.schema_version() for s in stores] == [SCHEMA_VERSION] * 4
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM gelbridge_schema").fetchone() == (1,)
    for s in stores:
        await s.aclose()


async def test_a_database_from_a_newer_gelbridge_is_refused(postgres_url: str) -> None:
    await (await PostgresStore(postgres_url).open()).aclose()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE gelbridge_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StateError, match="upgrade gelbridge"):
        await PostgresStore(postgres_url).open()


async def test_an_unreachable_server_is_one_clear_error_within_the_timeout() -> None:
    url = f"postgresql://gelbridge:hunter2@127.0.0.1:{free_port()}/gelbridge"
    t0 = time.monotonic()
    with pytest.raises(StateError) as e:
        await PostgresStore(url, timeout=1.0).open()
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "unreachable" in msg and "[state] url" in msg and "\n" not in msg
    assert "hunter2" not in msg  # never the password


async def test_a_lost_connection_fails_one_call_and_the_next_reconnects(postgres_url: str) -> None:
    async with PostgresStore(postgres_url, connections=1) as s:
        await s.set_cursor("src", 1)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'gelbridge' AND pid <> pg_backend_pid()")
        with pytest.raises(StateError, match="unreachable"):
            await s.set_cursor("src", 2)
        await s.set_cursor("src", 3)  # a new connection
        assert await s.get_cursor("src") == 3


async def test_a_transaction_waiting_on_a_lock_does_not_hold_up_the_other_connections(postgres_url: str) -> None:
    async with PostgresStore(postgres_url, connections=2) as s:
        await s.record_claim("did:a", "m1", 0, "m1.r0", "conv")
        with psycopg.connect(postgres_url) as blocker:  # another worker holds the row
            blocker.execute("SELECT 1 FROM claims WHERE reply_rkey = 'm1.r0' FOR UPDATE")
            stuck = asyncio.create_task(s.add_calls("did:a", "m1.r0", ["d1"]))  # waits for the row
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            await s.set_cursor("src", 1)  # the second connection: not behind the first
            assert await s.get_cursor("src") == 1 and time.monotonic() - t0 < 0.5
            assert not stuck.done()
        assert (await asyncio.wait_for(stuck, 10)).calls == {"d1"}  # the lock went with the blocker


async def test_a_statement_stuck_behind_a_lock_ends_at_the_timeout(postgres_url: str) -> None:
    async with PostgresStore(postgres_url, timeout=1.0) as s:
        await s.record_claim("did:a", "m1", 0, "m1.r0", "conv")
        with psycopg.connect(postgres_url) as blocker:  # holds the row lock, never commits
            blocker.execute("SELECT 1 FROM claims WHERE reply_rkey = 'm1.r0' FOR UPDATE")
            t0 = time.monotonic()
            with pytest.raises(StateError, match=r"took over 1 s \(\[state\] timeout\)"):
                await s.update_claim_status("did:a", "m1.r0", "complete")
            assert time.monotonic() - t0 < 3
        await s.update_claim_status("did:a", "m1.r0", "complete")  # the lock is gone: it works again
        assert await s.is_finished("did:a", "m1.r0")


async def test_no_call_id_is_kept_in_the_clear(postgres_url: str) -> None:
    async with PostgresStore(postgres_url) as s:
        ref = CallRef("did:a", "conv", "call-CANARY-7f3e")
        await s.record_claim("did:a", "m", 0, "m.r0", "conv")
        await s.begin_tool_call(ref, "m.r0", "t", "d")
        await s.finish_tool_call(ref, b"sealed", "k", False)
    with psycopg.connect(postgres_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        for table in tables:
            dump = conn.execute(f'SELECT coalesce(string_agg(t::text, \'\n\'), \'\') FROM "{table}" t').fetchone()
            assert "CANARY" not in dump[0], table


async def test_config_selects_postgres_and_keeps_its_password_out_of_the_file(postgres_url: str,
                                                                              tmp_path: Path) -> None:
    settings = load_config(env={"GELBRIDGE_STATE_URL": postgres_url})
    async with await open_state(settings) as s:
        assert isinstance(s, PostgresStore) and s.backend == "postgres" and s.location == redacted(postgres_url)
    cfg = tmp_path / "g.toml"
    cfg.write_text('[state]\nurl = "postgresql://bot:s3cret@127.0.0.1/gel"\n')
    with pytest.raises(ConfigError, match="GELBRIDGE_STATE_URL") as e:
        load_config(cfg, env={})
    assert "s3cret" not in str(e.value)
    cfg.write_text('[state]\nurl = "mysql://127.0.0.1/gel"\n')
    with pytest.raises(ConfigError, match="postgresql://"):
        load_config(cfg, env={})
    assert redacted("postgresql://bot:s3cret@db.internal:6432/gel") == "postgresql://bot@db.internal:6432/gel"
