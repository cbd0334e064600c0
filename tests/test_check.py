"""``gelbridge check`` without a PDS: problems it finds in the files, and in what the providers answer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gelbridge._check import check_settings
from gelbridge._config import Settings
from gelbridge._errors import ConfigError


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


def test_the_files_problems_and_the_worlds_come_in_one_report(tmp_path: Path) -> None:
    from gelbridge._check import check_config
    from gelbridge._config import read_config

    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text('[account]\nidentifier = "a.test"\n[wacth]\nsource = "poll"\n[tools]\nmax_step = 3\n'
                   '[providers.openai]\nadapter = "openia"\nbase_url = "https://api.openai.com/v1"\n'
                   'api_key_env = "OPENAI_API_KEY"\n')
    rep = asyncio.run(check_config(read_config(cfg, env={}), environ={}, login=False))
    assert rep.problems[:2] == ["[wacth]: unknown section; did you mean [watch]?",
                                "[tools] max_step: unknown key; did you mean [tools] max_steps?"]
    assert any(p.startswith("[providers.openai] adapter = 'openia': no such adapter") for p in rep.problems)
    assert "[providers.openai] api_key_env: $OPENAI_API_KEY is not set; export the API key in it" in rep.problems


def test_no_config_file_is_one_problem_that_says_how_to_make_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gelbridge._check import check_config
    from gelbridge._config import read_config

    monkeypatch.chdir(tmp_path)
    rep = asyncio.run(check_config(read_config(None, env={}), environ={}, login=False))
    [problem] = rep.problems
    assert problem.startswith("no config file found (--config FILE, $GELBRIDGE_CONFIG, ./gelbridge.toml)")
    # the account from the environment alone: checked as it is (no file is needed then)
    env = {"GELBRIDGE_IDENTIFIER": "a.test", "GELBRIDGE_KEYRING": str(tmp_path / "k.json")}
    rep = asyncio.run(check_config(read_config(None, env=env), environ=env, login=False))
    assert not any("no config file" in p for p in rep.problems) and rep.lines[0].startswith("config     no file")
    assert any(p.startswith("[keyring] path: keyring file") for p in rep.problems)


def test_an_adapters_dir_that_is_not_there_is_named(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    settings = Settings.model_validate({"adapters": {"dirs": [str(tmp_path / "nowhere"), str(tmp_path / "a-file"),
                                                              str(tmp_path)]}})
    rep = asyncio.run(check_settings(settings, environ={}, login=False))
    assert [p for p in rep.problems if p.startswith("[adapters] dirs")] == [
        f"[adapters] dirs: {tmp_path / 'nowhere'} does not exist: create it (your .lua adapters go there) "
        "or take it out of dirs",
        f"[adapters] dirs: {tmp_path / 'a-file'} is not a directory: create it (your .lua adapters go there) "
        "or take it out of dirs",
    ]


def test_keyring_problems_name_where_the_path_is_set_and_fit_a_key_from_the_chat_app(tmp_path: Path) -> None:
    from gelbridge._sealing import Keyring

    def problems(**data: object) -> list[str]:
        settings = Settings.model_validate(data)
        rep = asyncio.run(check_settings(settings, environ={}, login=False))
        return [p for p in rep.problems if "keyring" in p]

    missing = tmp_path / "missing.json"
    [wrong] = problems(account={"identifier": "a.test"}, keyring={"path": str(missing)})
    assert wrong.startswith(f"[keyring] path: keyring file {missing} does not exist: check the path, or save the "
                            "key your chat app shares in it")
    assert f"only when starting fresh, make a new one with 'gelbridge keys new --keyring {missing}'" in wrong
    [entry] = problems(accounts=[{"identifier": "b.test", "keyring": str(missing)}])
    assert entry.startswith(f"[[accounts]] b.test keyring: keyring file {missing} does not exist")
    Keyring().save(tmp_path / "empty.json")
    [empty] = problems(account={"identifier": "a.test"}, keyring={"path": str(tmp_path / "empty.json")})
    assert empty.startswith(f"[keyring] path: {tmp_path / 'empty.json'} holds no key: save the key your chat app")
    [unset] = problems(account={"identifier": "a.test"})
    assert unset == ("[keyring] path: not set: name the keyring file there (or in $GELBRIDGE_KEYRING), "
                     "or set [keyring] bridge_key so apps can grant keys")


def test_check_loads_the_bridge_keys_and_then_needs_no_keyring(tmp_path: Path) -> None:
    from gelbridge._grants import BridgeKey

    key = BridgeKey.generate(kid="b-1")
    key.save(tmp_path / "bridge.json")

    def report(**data: object) -> tuple[list[str], list[str]]:
        rep = asyncio.run(check_settings(Settings.model_validate(data), environ={}, login=False))
        return rep.problems, rep.lines

    problems, lines = report(account={"identifier": "a.test"}, keyring={"bridge_key": str(tmp_path / "bridge.json")})
    assert not [p for p in problems if "keyring" in p]
    assert f"bridge key b-1 fingerprint {key.fingerprint} (current, published at start)" in lines
    assert "keyring    [account]: none (keys come from the apps' key grants)" in lines
    missing = tmp_path / "nope.json"
    problems, _ = report(account={"identifier": "a.test"}, keyring={"bridge_key": [str(missing)]})
    assert [p for p in problems if "keyring" in p] == [
        f"[keyring] bridge_key: bridge key file {missing} does not exist: make one with "
        f"'gelbridge keys bridge-new --out {missing}'"]
    (tmp_path / "bad.json").write_text('{"scheme": "hpke-x25519-v1", "privateKey": "!!"}')
    problems, _ = report(account={"identifier": "a.test"}, keyring={"bridge_key": str(tmp_path / "bad.json")})
    assert any("privateKey is not standard base64" in p for p in problems)


async def test_check_asks_every_provider_and_names_each_mistake_on_its_own_line(tmp_path: Path) -> None:
    """A wrong key and a base_url nothing answers at are problems (run would refuse to
    start); a default model a proxy may still take is a warning; probe = false is not
    contacted. The key is in no line."""
    from gelbridge._config import load_config
    from gelbridge._dev.model_server import ModelServer
    from gelbridge._dev.pds import free_port

    key, closed = "sk-cnryq7x9zkw4", free_port()
    with ModelServer(api_key=key, models=["echo"]) as srv:
        url = srv.url
        cfg = tmp_path / "gelbridge.toml"
        cfg.write_text(f"""
[defaults]
model = {{ provider = "good", id = "echo-1" }}

[providers.good]
adapter = "openai"
base_url = "{srv.url}/v1"
api_key_env = "GOOD_KEY"

[providers.wrongkey]
adapter = "anthropic"
base_url = "{srv.url}"
api_key_env = "WRONG_KEY"

[providers.nowhere]
adapter = "gemini"
base_url = "http://127.0.0.1:{closed}/v1beta"

[providers.off]
adapter = "openai"
base_url = "http://127.0.0.1:{closed}/v1"
probe = false
""")
        settings = load_config(cfg, env={})
        rep = await check_settings(settings, environ={"GOOD_KEY": key, "WRONG_KEY": "sk-wrong"}, login=False)
    mine = [p for p in rep.problems if p.startswith("[providers.")]
    assert mine == [
        "[providers.wrongkey] api_key_env: the provider refused the key in $WRONG_KEY (HTTP 401 authentication_error "
        f"on GET {url}/v1/models); export a valid key",
        f"[providers.nowhere] base_url: connection refused at 127.0.0.1:{closed} (GET http://127.0.0.1:{closed}"
        f"/v1beta/models): nothing listens there; start the provider's server, or fix base_url (now "
        f"http://127.0.0.1:{closed}/v1beta)"]
    [warning] = rep.warnings
    assert warning.startswith("[providers.good] [defaults] model 'echo-1' is not among the 1 models")
    assert f"probe      good (openai): GET {url}/v1/models answered; key accepted" in rep.lines
    assert "probe      off (openai): not contacted (probe = false)" in rep.lines
    assert key not in "\n".join(rep.lines + rep.problems + rep.warnings)
    bad = tmp_path / "typo.toml"
    bad.write_text(f'[providers.x]\nadapter = "openai"\nbase_url = "{url}"\nprob = false\n')
    with pytest.raises(ConfigError, match="did you mean .*probe"):
        load_config(bad, env={})


def test_a_request_bound_the_adapters_cannot_hold_is_caught_at_start() -> None:
    def problems(**cfg: object) -> list[str]:
        rep = asyncio.run(check_settings(Settings.model_validate(cfg), environ={}, login=False, probe=False))
        return [p for p in rep.problems if p.startswith("[thread] max_request_bytes")]

    assert problems() == []  # the defaults: 8 MiB requests, 64 MB adapters
    assert problems(thread={"max_request_bytes": 16 * 1024 * 1024}) == []
    [p] = problems(thread={"max_request_bytes": 32 * 1024 * 1024})
    assert "raise memory_limit_mb to at least 128 or lower max_request_bytes" in p
    assert problems(thread={"max_request_bytes": 32 * 1024 * 1024}, adapters={"memory_limit_mb": 128}) == []


async def test_an_accounts_own_mcp_servers_are_checked_and_who_shares_each_is_said(tmp_path: Path) -> None:
    import sys

    server = str(Path(__file__).parent / "tools" / "mcp_test_server.py")
    settings = Settings.model_validate({
        "state": {"dir": str(tmp_path)},
        "mcp": {"servers": {"t": {"command": [sys.executable, server]},
                            "n": {"command": [sys.executable, server], "share": "account", "enabled": False}}},
        "accounts": [
            {"identifier": "a.test", "defaults": {"tools": ["mcp_t_echo", "mcp_x_echo"]}},
            {"identifier": "b.test", "defaults": {"tools": ["mcp_x_echo", "mcp_gone_echo"]},
             "mcp": {"servers": {"x": {"command": [sys.executable, server]},
                                 "gone": {"command": ["/nonexistent/server"], "startup_timeout": 5}}}},
        ],
    })
    rep = await check_settings(settings, environ={}, login=False, probe=False)
    tools = [ln for ln in rep.lines if ln.startswith("tools")]
    assert len(tools) == 2 and "mcp_t_echo" in tools[0] and "mcp_x_echo" not in tools[0]
    assert tools[1].startswith("tools      [[accounts]] b.test: ") and "mcp_x_echo" in tools[1]
    assert [ln for ln in rep.lines if ln.startswith("mcp")] == [
        "mcp        t (one per process); b.test: x (one per process), gone (one per process)"]
    problems = [p for p in rep.problems if "mcp" in p]
    assert len(problems) == 3, problems
    assert problems[0].startswith("[[accounts]] a.test defaults tools: 'mcp_x_echo' is not a tool here")
    assert problems[1].startswith("[[accounts]] b.test: [mcp.servers.gone]: the server did not start")
    assert problems[2].startswith("[[accounts]] b.test defaults tools: 'mcp_gone_echo' is not a tool here")
