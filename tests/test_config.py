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
