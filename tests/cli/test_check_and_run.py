"""CLI: ``gelbridge check`` and ``gelbridge run`` before any PDS is reached: the file's
problems and the world's come in one run, one line each, and ``run`` opens no state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gelbridge._sealing import Keyring


def gelbridge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GELBRIDGE_") and k not in ("OPENAI_API_KEY", "CHECK_TEST_PASSWORD")}
    return subprocess.run([sys.executable, "-m", "gelbridge", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env, stdin=subprocess.DEVNULL)


def test_the_files_mistakes_and_the_worlds_come_in_one_round(tmp_path: Path) -> None:
    kr = Keyring()
    kr.add_new("k")
    kr.save(tmp_path / "keyring.json")
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text('[account]\nidentifier = "a.test"\npds = "http://127.0.0.1:9"\npassword_env = "CHECK_TEST_PASSWORD"\n'
                   '[keyring]\npath = "keyring.json"\n[state]\ndir = "state"\n'
                   '[wacth]\nsource = "poll"\n[tools]\nmax_step = 3\n'
                   '[providers.openai]\nadapter = "openia"\nbase_url = "https://api.openai.com/v1"\n'
                   'api_key_env = "OPENAI_API_KEY"\n')
    expected = [
        "error: [wacth]: unknown section; did you mean [watch]?",
        "error: [tools] max_step: unknown key; did you mean [tools] max_steps?",
        "error: [providers.openai] adapter = 'openia': no such adapter (loaded: anthropic, deepseek, gemini, ollama, "
        "openai, openai-responses, openrouter; see 'gelbridge adapters list')",
        "error: [providers.openai] api_key_env: $OPENAI_API_KEY is not set; export the API key in it",
        "error: [account] password_env: $CHECK_TEST_PASSWORD is not set; export an app password in it",
    ]
    check = gelbridge("check", "--config", str(cfg), cwd=tmp_path)
    assert check.returncode == 1 and check.stdout == ""
    assert check.stderr.splitlines() == [*expected, f"check: 5 problems in {cfg}"]
    run = gelbridge("run", "--config", str(cfg), cwd=tmp_path)
    assert run.returncode == 1 and "ready" not in run.stdout
    assert run.stderr.splitlines() == [*expected, f"run: 5 problems in {cfg}; nothing was started"]
    assert not (tmp_path / "state").exists()  # run opened no state


def test_without_a_config_file_check_and_run_say_so_and_offline_commands_still_work(tmp_path: Path) -> None:
    for command in ("check", "run"):
        r = gelbridge(command, cwd=tmp_path)
        assert r.returncode == 1
        assert r.stderr == ("error: no config file found (--config FILE, $GELBRIDGE_CONFIG, ./gelbridge.toml): "
                            "write one (the README's gelbridge.toml example) and pass it with --config FILE\n")
    listed = gelbridge("adapters", "list", cwd=tmp_path)
    assert listed.returncode == 0 and "openai" in listed.stdout
    (tmp_path / "gelbridge.toml").write_text('[wacth]\nsource = "poll"\n')  # found in the working directory
    found = gelbridge("check", cwd=tmp_path)
    assert found.returncode == 1 and "[wacth]: unknown section" in found.stderr


def _search_config(tmp_path: Path, model_url: str, providers: dict[str, str], *, default: str,
                   tools_table: str = "") -> Path:
    kr = Keyring()
    kr.add_new("k")
    kr.save(tmp_path / "keyring.json")
    cfg = tmp_path / "gelbridge.toml"
    blocks = "".join(f'[providers.{name}]\nadapter = "{adapter}"\nbase_url = "{model_url}/v1"\n'
                     for name, adapter in providers.items())
    cfg.write_text('[account]\nidentifier = "a.test"\npds = "http://127.0.0.1:9"\npassword_env = "CHECK_TEST_PASSWORD"\n'
                   '[keyring]\npath = "keyring.json"\n[state]\ndir = "state"\n'
                   f'[defaults]\nmodel = {{ provider = "{default}", id = "gpt-5" }}\n'
                   'tools = ["web_search", "current_time"]\n'
                   f'{tools_table}{blocks}')
    return cfg


PASSWORD_LINE = "error: [account] password_env: $CHECK_TEST_PASSWORD is not set; export an app password in it"


def test_web_search_in_the_defaults_is_a_tool_where_a_provider_runs_it(tmp_path: Path) -> None:
    """``[defaults] tools = ["web_search"]`` (docs/tools.md) passes check and run when a configured
    provider's adapter has native search; the default model's provider without it is a warning;
    with none at all, or with it turned off, it is one problem that names the adapters that have it."""
    from gelbridge._dev.model_server import ModelServer

    with ModelServer(models=["gpt-5"]) as srv:
        cfg = _search_config(tmp_path, srv.url, {"search": "openai-responses"}, default="search")
        for command in ("check", "run"):
            r = gelbridge(command, "--config", str(cfg), cwd=tmp_path)
            assert r.returncode == 1 and r.stderr.splitlines() == [PASSWORD_LINE]  # only the PDS password
        mixed = _search_config(tmp_path, srv.url, {"chat": "openai", "search": "anthropic"}, default="chat")
        r = gelbridge("check", "--config", str(mixed), cwd=tmp_path)
        assert r.stderr.splitlines() == [
            "warning: [defaults] tools: 'web_search': the default model's provider 'chat' (adapter 'openai') has "
            "no native web_search, so its turns go without it (providers that have it here: search)",
            PASSWORD_LINE]
        none = _search_config(tmp_path, srv.url, {"chat": "openai"}, default="chat")
        refused = ("error: [defaults] tools: 'web_search' is run by the model provider, and no configured provider "
                   "has it: configure one whose adapter is 'anthropic' or 'gemini' or 'openai-responses', "
                   "or take it out of tools")
        for command in ("check", "run"):
            r = gelbridge(command, "--config", str(none), cwd=tmp_path)
            assert r.returncode == 1 and r.stderr.splitlines()[:2] == [refused, PASSWORD_LINE], r.stderr
        off = _search_config(tmp_path, srv.url, {"search": "openai-responses"}, default="search",
                             tools_table="[tools.web_search]\nenabled = false\n")
        r = gelbridge("check", "--config", str(off), cwd=tmp_path)
        assert r.stderr.splitlines()[0] == ("error: [defaults] tools: 'web_search' is turned off "
                                            "([tools.web_search] enabled = false): take it out of tools or turn it on")
    assert not (tmp_path / "state").exists()  # run opened no state
