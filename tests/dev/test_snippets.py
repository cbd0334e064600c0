"""What the dev commands print for gelbridge.toml is a valid configuration once pasted:
the account block of ``dev pds`` / ``dev account`` and the model block of ``dev model``,
together, load strictly; the demo's file too."""

from __future__ import annotations

from pathlib import Path

from gelbridge._config import load_config
from gelbridge._dev.demo import demo_config
from gelbridge._dev.snippets import (
    DEV_TOOLS,
    MODEL_KEY_ENV,
    PASSWORD_ENV,
    WIRES,
    account_toml,
    model_toml,
    provider_tables,
)

PDS = "http://localhost:2583"
MODEL = "http://127.0.0.1:8765"


def test_the_account_and_model_blocks_pasted_together_load_strictly(tmp_path: Path) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(account_toml(PDS, "alice.test") + "\n" + model_toml(MODEL))
    s = load_config(cfg, env={})
    assert (s.account.pds, s.account.identifier, s.account.password_env) == (PDS, "alice.test", PASSWORD_ENV)
    assert s.keyring.path == tmp_path / "keyring.json" and s.state.dir == tmp_path / "state"
    assert s.defaults.model is not None and (s.defaults.model.provider, s.defaults.model.id) == ("local", "echo")
    assert s.defaults.tools == list(DEV_TOOLS)
    assert {name: (p.adapter, p.base_url, p.api_key_env) for name, p in s.providers.items()} == {
        "local": ("openai", f"{MODEL}/v1", None),
        "local-responses": ("openai-responses", f"{MODEL}/v1", None),
        "local-anthropic": ("anthropic", MODEL, None),
        "local-gemini": ("gemini", f"{MODEL}/v1beta", None),
        "local-ollama": ("ollama", MODEL, None),
    }
    assert "gelbridge keys new --keyring keyring.json" in cfg.read_text()


def test_a_keyed_model_server_names_its_key_variable(tmp_path: Path) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(account_toml(PDS, "bob.test", password_env="BOB_PW") + model_toml(MODEL, api_key_env=MODEL_KEY_ENV))
    s = load_config(cfg, env={})
    assert s.account.password_env == "BOB_PW"
    assert {p.api_key_env for p in s.providers.values()} == {MODEL_KEY_ENV}
    assert set(provider_tables(MODEL, MODEL_KEY_ENV)) == {w[0] for w in WIRES} == set(s.providers)


def test_the_demo_config_loads(tmp_path: Path) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(demo_config(PDS, "demo1.test", MODEL, tmp_path))
    s = load_config(cfg, env={})
    assert list(s.providers) == ["local"] and s.providers["local"].base_url == f"{MODEL}/v1"
    assert s.defaults.model is not None and s.defaults.model.id == "echo-1" and s.defaults.tools == []
    assert s.replies.update_interval == 2 and "keys new" not in cfg.read_text()
