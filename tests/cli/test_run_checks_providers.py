"""``gelbridge run`` asks every provider before it starts: a wrong key stops it with the
provider's line and exit code 1, before anything is opened or written (``check`` says the
same); with the right key that line is gone."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gelbridge._cli import app
from gelbridge._dev.model_server import ModelServer
from gelbridge._sealing import Keyring

KEY = "sk-right-cnryq7x9zkw4"


def config(tmp_path: Path, model_url: str) -> Path:
    ring = Keyring()
    ring.add_new("k1")
    ring.save(tmp_path / "keyring.json")
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(f"""
[account]
pds = "http://127.0.0.1:1"
identifier = "bot.test"

[keyring]
path = "keyring.json"

[state]
dir = "state"

[defaults]
model = {{ provider = "openai", id = "gpt-4.1" }}

[providers.openai]
adapter = "openai"
base_url = "{model_url}/v1"
api_key_env = "PROBE_TEST_KEY"
""")
    return cfg


def test_run_refuses_to_start_on_a_key_the_provider_refuses(tmp_path: Path) -> None:
    with ModelServer(api_key=KEY, models=["gpt-4.1"]) as srv:
        cfg = config(tmp_path, srv.url)
        run = CliRunner().invoke(app, ["run", "--config", str(cfg)], env={"PROBE_TEST_KEY": "sk-wrong"})
        line = (f"error: [providers.openai] api_key_env: the provider refused the key in $PROBE_TEST_KEY "
                f"(HTTP 401 invalid_api_key on GET {srv.url}/v1/models); export a valid key")
        assert run.exit_code == 1, run.output
        assert line in run.stderr and "; nothing was started" in run.stderr
        assert "ready" not in run.stdout and "Traceback" not in run.stderr
        assert not (tmp_path / "state").exists()  # stopped before opening its state
        check = CliRunner().invoke(app, ["check", "--config", str(cfg)], env={"PROBE_TEST_KEY": "sk-wrong"})
        assert check.exit_code == 1 and line in check.stderr
        good = CliRunner().invoke(app, ["check", "--config", str(cfg)], env={"PROBE_TEST_KEY": KEY})
    assert "[providers." not in good.stderr and good.stderr.count("error: ") == 1  # only the PDS password
    assert KEY not in run.output + check.output + good.output
