"""Configuration: one TOML file plus environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from gelbridge._config import load_config
from gelbridge._errors import ConfigError
from gelbridge._tools.config import mcp_servers


def write(tmp_path: Path, text: str) -> Path:
    sub = tmp_path / "conf"
    sub.mkdir(parents=True)
    p = sub / "gelbridge.toml"
    p.write_text(text)
    return p


def test_paths_in_the_file_are_relative_to_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, '[keyring]\npath = "keys.json"\n[state]\ndir = "state"\n[adapters]\ndirs = ["lua"]\n')
    s = load_config(p, env={})
    assert s.keyring.path == p.parent / "keys.json"
    assert s.state_dir == p.parent / "state"
    assert s.adapters.dirs == [p.parent / "lua"]


def test_stdio_mcp_servers_run_in_the_config_folder_unless_told_otherwise(tmp_path: Path) -> None:
    p = write(tmp_path, (
        '[mcp.servers.a]\ncommand = ["python", "s.py"]\n'
        '[mcp.servers.b]\ncommand = ["python", "s.py"]\ncwd = "tools"\n'
        '[mcp.servers.c]\ncommand = ["python", "s.py"]\ncwd = "/opt/x"\n'
        '[mcp.servers.d]\nurl = "http://127.0.0.1:1/mcp"\n'
    ))
    servers = mcp_servers(load_config(p, env={}).mcp)
    assert servers["a"].cwd == str(p.parent)
    assert servers["b"].cwd == str(p.parent / "tools")
    assert servers["c"].cwd == "/opt/x"
    assert servers["d"].cwd is None


def test_environment_overrides_single_keys(tmp_path: Path) -> None:
    p = write(tmp_path, '[account]\npds = "https://a.example"\n')
    s = load_config(p, env={"GELBRIDGE_PDS": "http://127.0.0.1:9", "GELBRIDGE_KEYRING": "/k.json"})
    assert s.account.pds == "http://127.0.0.1:9"
    assert s.keyring.path == Path("/k.json")


def test_bad_files_give_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[account\n"), env={})
    bad = tmp_path / "bad.toml"
    bad.write_text('[replies]\nupdate_interval = "soon"\n')
    with pytest.raises(ConfigError, match=r"\[replies\] update_interval"):
        load_config(bad, env={})


def test_web_search_options_are_checked_at_start(tmp_path: Path) -> None:
    from gelbridge._tools.config import builtin_config

    ok = load_config(write(tmp_path, '[tools.web_search]\nmax_uses = 3\nallowed_domains = ["wikipedia.org"]\n'),
                     env={})
    cfg = builtin_config(ok.tools, "web_search")
    assert cfg.options() == {"max_uses": 3, "allowed_domains": ["wikipedia.org"]}
    both = write(tmp_path / "2", '[tools.web_search]\nallowed_domains = ["a.org"]\nblocked_domains = ["b.org"]\n'
                           "max_uses = 0\nmax_usse = 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(both, env={})
    text = str(e.value)
    assert "[tools.web_search] max_uses: Input should be greater than or equal to 1" in text
    assert "[tools.web_search] max_usse: unknown key; did you mean [tools.web_search] max_uses?" in text
    with pytest.raises(ConfigError, match=r"\[tools.web_search\] set allowed_domains or blocked_domains, not both"):
        load_config(write(tmp_path / "3", '[tools.web_search]\nallowed_domains = ["a.org"]\n'
                                          'blocked_domains = ["b.org"]\n'), env={})


def test_a_file_with_problems_gives_all_of_them_and_the_settings_that_parsed(tmp_path: Path) -> None:
    from gelbridge._config import read_config

    p = write(tmp_path, (
        '[wacth]\nsource = "poll"\n'
        '[tools]\nmax_step = 3\ncall_timeout = 5\n'
        '[state]\nurl = "postgresql://bot:secret@127.0.0.1/db"\n'
        '[replies]\nupdate_interval = "soon"\nallow_plain = false\n'
        '[providers.openai]\nadapter = "openia"\nbase_url = "https://api.openai.com/v1"\napi_key_env = "OPENAI_API_KEY"\n'
        '[providers.broken]\nadapter = 5\nbase_url = "http://127.0.0.1:9"\n'
        '[[accounts]]\nname = "no-identifier"\n'
        '[[accounts]]\nidentifier = "b.test"\nkeyring = "b.json"\nkeyrnig = "typo"\n'
        '[mcp.servers.bad]\ncommand = ["x"]\nbogus = 1\n'
        '[mcp.servers.good]\ncommand = ["y"]\n'
    ))
    read = read_config(p, env={})
    assert read.path == p and sorted(read.problems) == sorted([
        "[state] url has a password in it; keep secrets out of the file: set GELBRIDGE_STATE_URL (the whole URL) "
        "or PGPASSWORD instead",
        "[replies] update_interval: Input should be a valid number, unable to parse string as a number",
        "[providers.broken] adapter: Input should be a valid string",
        "[accounts.0] identifier: Field required",
        "[accounts.1] keyrnig: unknown key; did you mean [accounts.1] keyring?",
        "[wacth]: unknown section; did you mean [watch]?",
        "[tools] max_step: unknown key; did you mean [tools] max_steps?",
        "[mcp.servers.bad] bogus: unknown key; known here: " + ", ".join(sorted(
            ["approval", "command", "cwd", "enabled", "env", "env_passthrough", "headers", "headers_env",
             "share", "startup_timeout", "tools", "url"])),
    ])
    s = read.settings  # what parsed, the keys with problems at their defaults (an entry lacking one: left out)
    assert s.providers["openai"].adapter == "openia" and "broken" not in s.providers
    assert s.replies.update_interval == 2.0 and s.replies.allow_plain is False
    assert s.state.url is None and s.tools_settings.call_timeout == 5 and s.tools_settings.max_steps == 8
    assert [(a.identifier, a.keyring) for a in s.accounts] == [("b.test", p.parent / "b.json")]
    assert list(s.mcp["servers"]) == ["good"]
    with pytest.raises(ConfigError) as e:  # load_config refuses the file, naming every problem
        load_config(p, env={})
    assert str(e.value).startswith(f"{p}: 8 problems:\n") and all(line in str(e.value) for line in read.problems)


def test_the_file_is_looked_for_in_the_working_directory_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gelbridge._config import read_config

    monkeypatch.chdir(tmp_path)
    assert read_config(None, env={}).path is None  # no file anywhere: embedded defaults
    (tmp_path / "gelbridge.toml").write_text('[watch]\nsource = "poll"\n')
    here = read_config(None, env={})
    assert here.path == tmp_path / "gelbridge.toml" and here.settings.watch.source == "poll"
    named = write(tmp_path / "elsewhere", '[watch]\nsource = "jetstream"\n')
    assert read_config(None, env={"GELBRIDGE_CONFIG": str(named)}).path == named
    assert load_config(named, env={}).watch.source == "jetstream"


def test_a_path_of_the_wrong_type_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    from gelbridge._config import read_config

    p = write(tmp_path, '[keyring]\npath = 1\n[state]\ndir = true\n[adapters]\ndirs = ["ok", 2]\n'
                        '[[accounts]]\nidentifier = "b.test"\nkeyring = 3\n')
    read = read_config(p, env={})
    assert sorted(read.problems) == ["[accounts.0] keyring: must be a path (a string)",
                                     "[adapters.dirs] 1: must be a path (a string)",
                                     "[keyring] path: must be a path (a string)",
                                     "[state] dir: must be a path (a string)"]
    assert read.settings.adapters.dirs == [p.parent / "ok"]


def test_the_listen_address_says_what_is_wrong_with_it(tmp_path: Path) -> None:
    tries = iter(range(100))

    def listen(value: str) -> str | None:
        where = tmp_path / str(next(tries))
        return load_config(write(where, f'[observability]\nlisten = "{value}"\n')).observability.listen

    assert listen("127.0.0.1:0") == "127.0.0.1:0" and listen("[::1]:9464") == "[::1]:9464"
    with pytest.raises(ConfigError) as err:
        listen("127.0.0.1:99999")
    assert str(err.value).endswith(
        "[observability] listen: port 99999 is out of range: 1-65535 (or 0 for any free port)")
    for wrong in ("127.0.0.1", ":9464", "localhost:http", "127.0.0.1:-1"):
        with pytest.raises(ConfigError, match=r'\[observability\] listen: must be "host:port", e.g. "127.0.0.1:9464"$'):
            listen(wrong)


def test_the_listeners_bounds_are_checked_strictly(tmp_path: Path) -> None:
    tries = iter(range(100))

    def observability(text: str) -> tuple[int, float]:
        obs = load_config(write(tmp_path / str(next(tries)), f"[observability]\n{text}\n"), env={}).observability
        return obs.max_connections, obs.request_timeout

    assert observability("") == (256, 5.0)
    assert observability("max_connections = 32\nrequest_timeout = 2") == (32, 2.0)
    for wrong, says in (("max_connections = 0", "greater than or equal to 1"),
                        ("max_connections = 5000", "less than or equal to 4096"),
                        ("max_connections = true", "a valid integer"),
                        ('request_timeout = "5"', "a valid number"),
                        ("request_timeout = 0", "greater than 0"),
                        ("request_timeout = 301", "less than or equal to 300")):
        key = wrong.split()[0]
        with pytest.raises(ConfigError, match=rf"\[observability\] {key}: Input should be {says}"):
            observability(wrong)


def test_an_account_may_have_mcp_servers_of_its_own(tmp_path: Path) -> None:
    """``[accounts.mcp.servers.<name>]``: checked like ``[mcp]``, relative to the file, and a
    server of the same name replaces the process's for that account only."""
    from gelbridge._config import read_config

    p = write(tmp_path, (
        '[mcp.servers.time]\ncommand = ["python", "time.py"]\n'
        '[mcp.servers.notes]\ncommand = ["python", "notes.py"]\nshare = "account"\n'
        '[[accounts]]\nidentifier = "a.test"\n'
        '[[accounts]]\nidentifier = "b.test"\n'
        '[accounts.mcp.servers.time]\ncommand = ["python", "time.py", "--tz", "UTC"]\ncwd = "b"\n'
        '[accounts.mcp.servers.notes]\nurl = "http://127.0.0.1:1/mcp"\nenabled = false\n'
        '[accounts.mcp.servers.files]\ncommand = ["python", "files.py"]\n'
        '[[accounts]]\nname = "c"\nidentifier = "c.test"\n'
        '[accounts.mcp.servers.bad]\ncommand = ["x"]\nshare = "thread"\n'
        '[accounts.mcp.servers.fine]\ncommand = ["y"]\n'
    ))
    read = read_config(p, env={})
    assert read.problems == ["[[accounts]] c: [mcp.servers.bad] share: Input should be 'process' or 'account'"]
    a, b, c = (read.settings.for_account(e) for e in read.settings.accounts_list())
    sa, sb, sc = mcp_servers(a.mcp), mcp_servers(b.mcp), mcp_servers(c.mcp)
    assert sa == mcp_servers(read.settings.mcp) and list(sa) == ["time", "notes"]
    assert sa["notes"].share == "account" and sa["time"].share == "process"
    assert list(sb) == ["time", "notes", "files"]
    assert sb["time"].command == ["python", "time.py", "--tz", "UTC"] and sb["time"].cwd == str(p.parent / "b")
    assert sb["notes"].enabled is False and sb["files"].cwd == str(p.parent)
    assert list(sc) == ["time", "notes", "fine"]  # the bad one is left out (and named above)
    assert read.settings.mcp == a.mcp  # the process's own table is not changed
    with pytest.raises(ConfigError, match=r"\[\[accounts\]\] c: \[mcp.servers.bad\] share"):
        load_config(p, env={})
