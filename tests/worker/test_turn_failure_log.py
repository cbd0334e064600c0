"""The operator's log line for a turn the provider failed names the cause (refused at
host:port, TLS, HTTP status with the provider's known code, a model the provider does
not have), never the provider's error body or the key; the reply keeps the protocol's
generic message. The worker's own turn, offline on examples/conversation."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gelbridge._adapters.client import ModelClient
from gelbridge._config import Settings
from gelbridge._dev.model_server import Fail, ModelServer
from gelbridge._dev.pds import free_port
from gelbridge._sealing import Keyring
from gelbridge._worker.offline import run_offline

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"
RECORDS = EXAMPLE / "records.json"
CANARY = "cnryq7x9zkw4"
KEY = f"sk-{CANARY}-key"


def last_user_key() -> str:
    users = [r for r in json.loads(RECORDS.read_text())["records"] if r["value"].get("role") == "user"]
    return str(users[-1]["uri"]).rsplit("/", 1)[1]


async def failed_turn(base_url: str, key: str, caplog: pytest.LogCaptureFixture) -> tuple[str, dict[str, object]]:
    """The turn's failure line and the reply's error, for the example's last message
    (the example asks provider 'openai', model gpt-4o-mini)."""
    settings = Settings.model_validate({"providers": {"openai": {
        "adapter": "openai", "base_url": base_url, "api_key_env": "K", "max_retries": 0}}})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gelbridge"):
        async with ModelClient(settings, env={"K": key}) as client:
            turn = await run_offline(RECORDS, last_user_key(), Keyring.load(EXAMPLE / "keyring.json"), settings,
                                     model=client, stream=True, quiet=False)
    assert turn.reply is not None and turn.reply["status"] == "error"
    [line] = [r.getMessage() for r in caplog.records if " failed: " in r.getMessage()]
    for r in caplog.records:  # no line of the turn holds the provider's words or the key
        assert CANARY not in r.getMessage(), r.getMessage()
    return line, turn.reply["error"]  # type: ignore[return-value]


async def test_a_closed_port_is_named_in_the_failure_line(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    line, error = await failed_turn(f"http://127.0.0.1:{port}/v1", KEY, caplog)
    assert line.endswith(f"failed: server_error (ProviderError: provider 'openai': connection refused at "
                         f"127.0.0.1:{port})")
    assert error["kind"] == "server_error"


async def test_a_wrong_key_is_named_without_the_key(caplog: pytest.LogCaptureFixture) -> None:
    with ModelServer(api_key="sk-right") as srv:
        line, error = await failed_turn(srv.url + "/v1", KEY, caplog)
        assert line.endswith(f"failed: authentication (ProviderError: provider 'openai': HTTP 401 from "
                             f"127.0.0.1:{srv.port} (invalid_api_key))")
    assert error["kind"] == "authentication" and CANARY not in json.dumps(error)


async def test_an_error_body_never_reaches_the_line_only_its_status_and_code(
        caplog: pytest.LogCaptureFixture) -> None:
    with ModelServer(api_key=KEY) as srv:
        srv.enqueue(Fail(500, f"upstream said: {CANARY} (echoing the prompt)"))
        line, _ = await failed_turn(srv.url + "/v1", KEY, caplog)
        assert line.endswith(f"failed: server_error (ProviderError: provider 'openai': HTTP 500 from "
                             f"127.0.0.1:{srv.port} (server_error))")
        srv.enqueue(Fail(400, "bad", code=f"{CANARY}_code"))  # a code outside the vocabulary is left out
        line, _ = await failed_turn(srv.url + "/v1", KEY, caplog)
        assert line.endswith(f"failed: invalid_request (ProviderError: provider 'openai': HTTP 400 from "
                             f"127.0.0.1:{srv.port})")


async def test_a_model_the_provider_does_not_have_is_named_as_its_404(caplog: pytest.LogCaptureFixture) -> None:
    with ModelServer(api_key=KEY, models=["gpt-4.1"]) as srv:
        line, error = await failed_turn(srv.url + "/v1", KEY, caplog)
        assert line.endswith(f"failed: invalid_request (ProviderError: provider 'openai': HTTP 404 from "
                             f"127.0.0.1:{srv.port} (model_not_found))")
    assert "gpt-4o-mini" not in line  # the model id may be the user's choice: not logged


async def test_tls_to_a_plain_port_is_named(caplog: pytest.LogCaptureFixture) -> None:
    with ModelServer() as srv:
        line, _ = await failed_turn(f"https://127.0.0.1:{srv.port}/v1", KEY, caplog)
        assert f"(ProviderError: provider 'openai': TLS with 127.0.0.1:{srv.port} failed (" in line
