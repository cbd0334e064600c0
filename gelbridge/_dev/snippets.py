"""The configuration the dev commands print for pasting into ``gelbridge.toml`` (and the
demo writes): ``gelbridge dev pds`` / ``dev account`` the account, keyring and state,
``gelbridge dev model`` the default model, tools and one ``[providers.*]`` table per
wire format the local model server speaks. Pure: strings in, TOML text out."""

from __future__ import annotations

import json
from collections.abc import Sequence

#: the variable the printed [account] reads the app password from (as in the README)
PASSWORD_ENV = "GELBRIDGE_APP_PASSWORD"
#: the variable the printed [providers.*] read the key from, when `dev model --api-key`
MODEL_KEY_ENV = "GELBRIDGE_DEV_MODEL_KEY"
#: the tools the printed [defaults] offer: one that runs at once, one that asks first
DEV_TOOLS = ("current_time", "fetch_url")
MODEL_ID = "echo"

#: every wire format of the local model server: (provider name, built-in adapter, the
#: path its base_url carries, what it is); the first is the default model's
WIRES: tuple[tuple[str, str, str, str], ...] = (
    ("local", "openai", "/v1", "OpenAI Chat Completions"),
    ("local-responses", "openai-responses", "/v1", "OpenAI Responses"),
    ("local-anthropic", "anthropic", "", "Anthropic Messages"),
    ("local-gemini", "gemini", "/v1beta", "Gemini generateContent"),
    ("local-ollama", "ollama", "", "Ollama /api/chat"),
)


def _s(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def _commented(line: str, comment: str) -> str:
    return f"{line.ljust(40)}# {comment}" if comment else line


def provider_tables(model_url: str, api_key_env: str | None = None) -> dict[str, dict[str, str]]:
    """``[providers.<name>]`` for each wire format of the model server at ``model_url``."""
    tables: dict[str, dict[str, str]] = {}
    for name, adapter, path, _what in WIRES:
        tables[name] = {"adapter": adapter, "base_url": model_url.rstrip("/") + path}
        if api_key_env:
            tables[name]["api_key_env"] = api_key_env
    return tables


def account_toml(pds_url: str, handle: str, *, password_env: str = PASSWORD_ENV,
                 keyring: str = "keyring.json", state: str = "state", keyring_made: bool = False) -> str:
    """``[account]`` (with its PDS, so no lookup), ``[keyring]`` (how to make it, unless
    ``keyring_made``) and ``[state]``."""
    return f"""[account]
pds = {_s(pds_url)}
identifier = {_s(handle)}
password_env = {_s(password_env)}

[keyring]
{_commented(f"path = {_s(keyring)}", "" if keyring_made else f"make it: gelbridge keys new --keyring {keyring}")}

[state]
dir = {_s(state)}
"""


def model_toml(model_url: str, *, api_key_env: str | None = None, tools: Sequence[str] = DEV_TOOLS,
               model_id: str = MODEL_ID, instructions: str | None = None, every_wire: bool = True) -> str:
    """``[defaults]`` (the model at ``model_url`` behind its first wire, ``tools``) and
    the ``[providers.*]`` tables (only the first unless ``every_wire``)."""
    lines = ["[defaults]", f"model = {{ provider = {_s(WIRES[0][0])}, id = {_s(model_id)} }}"]
    if instructions is not None:
        lines.append(f"instructions = {_s(instructions)}")
    if tools:
        lines.append(_commented(f"tools = [{', '.join(_s(t) for t in tools)}]",
                                "fetch_url asks for approval first" if "fetch_url" in tools else ""))
    tables = provider_tables(model_url, api_key_env)
    for i, (name, _adapter, _path, what) in enumerate(WIRES if every_wire else WIRES[:1]):
        lines += ["", _commented(f"[providers.{name}]", what if every_wire else "")]
        lines += [f"{key} = {_s(value)}" for key, value in tables[name].items()]
        if i == 0 and every_wire:
            lines += ["", "# the same model in the other wire formats: make one the [defaults] model's provider"]
    return "\n".join(lines) + "\n"
