"""Configuration: one TOML file plus environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from gelbridge._config import load_config
from gelbridge._errors import ConfigError
from gelbridge._tools.config import mcp_servers


def write(tmp_path: Path, text: str) -> Path:
    sub = tmp_path / "conf"
    sub.mkdir()
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
