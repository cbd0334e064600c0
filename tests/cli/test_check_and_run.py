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
