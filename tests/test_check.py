"""``gelbridge check`` without a PDS: problems it finds in the files alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gelbridge._check import check_settings
from gelbridge._config import Settings


def test_an_adapter_script_that_does_not_load_is_named_with_its_file(tmp_path: Path) -> None:
    (tmp_path / "broken.lua").write_text("return {name = 'broken', transform_request = function(\n")
    settings = Settings.model_validate({"adapters": {"dirs": [str(tmp_path)]}})
    rep = asyncio.run(check_settings(settings, environ={}, login=False))
    [line] = [p for p in rep.problems if p.startswith("[adapters]")]
    assert f"{tmp_path / 'broken.lua'}: does not load:" in line


async def test_a_state_url_is_probed_at_start_without_changing_the_database(postgres_url: str) -> None:
    import psycopg

    from gelbridge._dev.pds import free_port
    from gelbridge._state._postgres import SCHEMA_VERSION, PostgresStore

    async def check(**state: object) -> tuple[list[str], list[str]]:
        settings = Settings.model_validate({"state": state, "watch": {"source": "poll"}})
        rep = await check_settings(settings, environ={}, login=False)
        return [p for p in rep.problems if p.startswith("[state]")], [ln for ln in rep.lines if ln.startswith("state")]

    problems, lines = await check(url=postgres_url)
    assert problems == [] and "empty: the first worker creates the tables" in lines[0]
    with psycopg.connect(postgres_url) as conn:  # the check created nothing
        assert conn.execute("SELECT to_regclass('gelbridge_schema')").fetchone() == (None,)
    await (await PostgresStore(postgres_url).open()).aclose()
    assert f"schema v{SCHEMA_VERSION}" in (await check(url=postgres_url))[1][0]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE gelbridge_schema SET version = %s", (SCHEMA_VERSION + 1,))
    [newer] = (await check(url=postgres_url))[0]
    assert "upgrade gelbridge" in newer
    [down] = (await check(url=f"postgresql://gelbridge:pw-7@127.0.0.1:{free_port()}/x", timeout=1))[0]
    assert "unreachable" in down and "pw-7" not in down
    settings = Settings.model_validate({"state": {"url": postgres_url},
                                        "watch": {"source": "jetstream", "url": "wss://js.example"}})
    rep = await check_settings(settings, environ={}, login=False)
    assert not any("jetstream" in p.lower() for p in rep.problems)  # a fleet on Jetstream is fine
    no_url = Settings.model_validate({"state": {"url": postgres_url}, "watch": {"source": "jetstream"}})
    rep = await check_settings(no_url, environ={}, login=False)
    assert any('needs url = "wss://<jetstream host>"' in p for p in rep.problems)
