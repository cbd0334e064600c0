"""The provider probe against real servers on 127.0.0.1, per built-in adapter: the local
wire server (the providers' real formats, a real 401 for a wrong key, 404 for a model it
does not have), a closed port, https to a plain-HTTP port, a web site where the API should
be; and custom adapters. No finding and no log line holds the key."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gelbridge._adapters.probe import Finding, probe_providers
from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import free_port
from testkit.web_server import Silent, web_site

CANARY = "cnryq7x9zkw4"
KEY = f"sk-{CANARY}"
OFFERED = ["echo", "m-1"]
#: where each built-in adapter's API lives under a server's root
ROOTS = {"openai": "/v1", "openai-responses": "/v1", "deepseek": "", "openrouter": "/api/v1", "anthropic": "",
         "gemini": "/v1beta", "ollama": ""}
#: a model the listing lacks: an error where the API looks the model up, else a warning
#: (a listing of a proxy or an OpenAI-compatible host may not name every id it takes)
MISSING_MODEL_LEVEL = {"openai": "warning", "openai-responses": "warning", "deepseek": "warning",
                       "openrouter": "warning", "anthropic": "error", "gemini": "error", "ollama": "error"}


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer(api_key=KEY, models=OFFERED) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server() -> Iterator[ModelServer]:
    """Ollama has no keys: its server (and the Ollama probe) uses none."""
    with ModelServer(models=OFFERED) as srv:
        yield srv


def settings(adapter: str, base_url: str, model: str | None = "m-1", **extra: object) -> Settings:
    data: dict[str, object] = {"providers": {"p": {"adapter": adapter, "base_url": base_url, "api_key_env": "K",
                                                   **extra}}}
    if model is not None:
        data["defaults"] = {"model": {"provider": "p", "id": model}}
    return Settings.model_validate(data)


async def probe(s: Settings, key: str = KEY, caplog: pytest.LogCaptureFixture | None = None,
                **kw: object) -> dict[str, list[str]]:
    found: list[Finding] = await probe_providers(s, {"K": key}, timeout=2.0, **kw)  # type: ignore[arg-type]
    out: dict[str, list[str]] = {"ok": [], "warning": [], "error": []}
    for f in found:
        assert CANARY not in f.text, f.text
        out[f.level].append(f.text)
    if caplog is not None:
        assert CANARY not in caplog.text
    return out


def base(adapter: str, srv: ModelServer, open_srv: ModelServer) -> str:
    return (open_srv if adapter == "ollama" else srv).url + ROOTS[adapter]


@pytest.mark.parametrize("adapter", list(ROOTS))
async def test_a_right_configuration_is_confirmed(adapter: str, server: ModelServer, open_server: ModelServer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    got = await probe(settings(adapter, base(adapter, server, open_server)), caplog=caplog)
    assert got["error"] == [] and got["warning"] == []
    first, model = got["ok"]
    assert ("key accepted" in first) is (adapter != "ollama")
    assert model.startswith("p: [defaults] model 'm-1' ") and model.endswith(("listed", "offered"))


@pytest.mark.parametrize("adapter", [a for a in ROOTS if a != "ollama"])
async def test_a_wrong_key_is_the_providers_401_named_under_its_provider(
        adapter: str, server: ModelServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    got = await probe(settings(adapter, server.url + ROOTS[adapter]), key=f"sk-wrong-{CANARY}", caplog=caplog)
    [line] = got["error"]
    assert line.startswith("[providers.p] api_key_env: the provider refused the key in $K (HTTP 401")
    assert line.endswith("export a valid key")


async def test_ollama_behind_a_key_says_its_adapter_sends_none(server: ModelServer) -> None:
    got = await probe(settings("ollama", server.url))
    [line] = got["error"]
    assert "wants a key (HTTP 401" in line and "adapter 'ollama' sends none" in line


@pytest.mark.parametrize("adapter", list(ROOTS))
async def test_a_closed_port_is_connection_refused(adapter: str) -> None:
    port = free_port()
    got = await probe(settings(adapter, f"http://127.0.0.1:{port}{ROOTS[adapter]}"))
    [line] = got["error"]
    assert line.startswith(f"[providers.p] base_url: connection refused at 127.0.0.1:{port} (GET http://127.0.0.1:")


@pytest.mark.parametrize("adapter", list(ROOTS))
async def test_https_to_a_plain_http_server_is_a_tls_error(adapter: str, server: ModelServer,
                                                           open_server: ModelServer) -> None:
    srv = open_server if adapter == "ollama" else server
    got = await probe(settings(adapter, f"https://127.0.0.1:{srv.port}{ROOTS[adapter]}"))
    [line] = got["error"]
    assert line.startswith(f"[providers.p] base_url: TLS with 127.0.0.1:{srv.port} failed (")


@pytest.mark.parametrize("adapter", list(ROOTS))
async def test_a_base_url_at_the_wrong_path_is_its_404(adapter: str) -> None:
    with web_site(404) as site:
        got = await probe(settings(adapter, site + "/wrong" + ROOTS[adapter]))
    [line] = got["error"]
    assert line.startswith("[providers.p] base_url: GET http://127.0.0.1:") and "answered 404" in line
    assert "base_url's path is not the API root" in line


async def test_a_web_page_where_the_api_should_be_is_named() -> None:
    with web_site(200) as site:
        got = await probe(settings("openai", site + "/v1"))
    [line] = got["error"]
    assert "answered HTTP 200 with a body that is not JSON" in line


@pytest.mark.parametrize("adapter", list(ROOTS))
async def test_a_default_model_the_provider_does_not_have(adapter: str, server: ModelServer,
                                                          open_server: ModelServer) -> None:
    got = await probe(settings(adapter, base(adapter, server, open_server), model="nope-9"))
    level = MISSING_MODEL_LEVEL[adapter]
    [line] = got[level]
    assert line.startswith("[providers.p] [defaults] model 'nope-9' ")
    other = "warning" if level == "error" else "error"
    assert got[other] == []


async def test_providers_are_asked_at_once_and_each_wait_is_bounded() -> None:
    with Silent() as silent:
        s = Settings.model_validate({"providers": {
            name: {"adapter": "openai", "base_url": f"http://127.0.0.1:{silent.port}/v1"} for name in ("a", "b", "c")}})
        found = await probe_providers(s, {}, timeout=0.5)
    assert silent.most == 3  # all three waited at the same time
    assert sorted(f.level for f in found) == ["warning"] * 3
    assert all("did not answer GET" in f.text and "in time" in f.text for f in found)


SCRIPT = """
local adapter = {{ name = "{name}", endpoint = "/v1/chat/completions", auth = "bearer"{probe} }}
function adapter.transform_request(raw) return raw end
function adapter.transform_response(raw) return raw end
return adapter
"""


def custom(tmp_path: Path, name: str, probe_field: str, base_url: str, **extra: object) -> Settings:
    (tmp_path / f"{name}.lua").write_text(SCRIPT.format(name=name, probe=probe_field))
    return Settings.model_validate({"adapters": {"dirs": [str(tmp_path)]}, "providers": {"p": {
        "adapter": name, "base_url": base_url, "api_key_env": "K", **extra}}})


async def test_a_custom_adapter_is_checked_as_it_declares(tmp_path: Path, server: ModelServer) -> None:
    # adapter.probe = "/v1/models": a key check like a built-in family's
    declared = await probe(custom(tmp_path, "mine", ', probe = "/v1/models"', server.url), key="sk-wrong")
    assert declared["error"][0].startswith("[providers.p] api_key_env: the provider refused the key in $K (HTTP 401")
    assert (await probe(custom(tmp_path, "mine", ', probe = "/v1/models"', server.url)))["error"] == []
    # adapter.probe = false, or probe = false in [providers.p]: not contacted at all
    off = await probe(custom(tmp_path, "quiet", ", probe = false", f"http://127.0.0.1:{free_port()}"))
    assert off == {"ok": ["p (quiet): not contacted (its adapter declares probe = false)"], "warning": [], "error": []}
    cfg_off = await probe(custom(tmp_path, "plain", "", f"http://127.0.0.1:{free_port()}", probe=False))
    assert cfg_off["ok"] == ["p (plain): not contacted (probe = false)"]
    # nothing declared: base_url must answer, anything at all
    with web_site(404) as site:
        reach = await probe(custom(tmp_path, "plain", "", site + "/v1"))
    assert reach["error"] == [] and "answers (HTTP 404; this adapter declares no check of the key)" in reach["ok"][0]
    refused = await probe(custom(tmp_path, "plain", "", f"http://127.0.0.1:{free_port()}"))
    assert refused["error"][0].startswith("[providers.p] base_url: connection refused at 127.0.0.1:")
    auth = await probe(custom(tmp_path, "plain", "", server.url + "/v1/models"), key="sk-wrong")
    [said] = auth["warning"]
    assert "answered HTTP 401 invalid_api_key" in said and auth["error"] == []


async def test_a_custom_script_with_a_builtin_name_gets_that_familys_probe(tmp_path: Path,
                                                                           server: ModelServer) -> None:
    s = custom(tmp_path, "openai", "", server.url + "/v1")
    s = s.model_copy(update={"defaults": Settings.model_validate(
        {"defaults": {"model": {"provider": "p", "id": "m-1"}}}).defaults})
    got = await probe(s)
    assert got["error"] == [] and "key accepted" in got["ok"][0] and "'m-1' listed" in got["ok"][1]


async def test_providers_the_check_already_refused_are_not_asked(server: ModelServer) -> None:
    s = Settings.model_validate({"providers": {
        "nokey": {"adapter": "openai", "base_url": server.url + "/v1", "api_key_env": "UNSET"},
        "noadapter": {"adapter": "opnai", "base_url": server.url + "/v1"}}})
    before = len(server.requests) + len(server.discovery)
    assert await probe_providers(s, {}) == []
    assert len(server.requests) + len(server.discovery) == before
