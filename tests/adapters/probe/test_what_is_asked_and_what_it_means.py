"""The pure half of the provider probe: what each adapter's API is asked, and what an
answer means for the operator (error, warning, fine), with what to fix."""

from __future__ import annotations

import json

import pytest

from gelbridge._adapters.probe import (
    FAMILIES,
    Answer,
    Call,
    DefaultModel,
    Finding,
    Plan,
    default_models,
    family_for,
    judge_first,
    judge_models,
    plan,
    shown,
)
from gelbridge._config import ProviderConfig, Settings
from gelbridge._errors import ProviderError, ProviderFault

DEFAULT = DefaultModel("m-1", "[defaults] model")


def cfg(adapter: str, base_url: str = "http://127.0.0.1:1", **kw: object) -> ProviderConfig:
    return ProviderConfig.model_validate({"adapter": adapter, "base_url": base_url, "api_key_env": "K", **kw})


def failed(url: str, what: str, status: int | None = None, code: str | None = None) -> Answer:
    fault = ProviderFault(what, host="h:443", status=status, code=code, provider="p")
    return Answer(url, error=ProviderError("the provider's words", status=status, fault=fault), fault=fault)


@pytest.mark.parametrize("adapter,first,then", [
    ("openai", "GET /models", []),  # the listing is the key check
    ("openai-responses", "GET /models", []),
    ("deepseek", "GET /models", []),
    ("openrouter", "GET /key", ["GET /models"]),  # its listing needs no key: /key proves it
    ("anthropic", "GET /v1/models?limit=1", ["GET /v1/models/{model}"]),  # the lookup resolves aliases
    ("gemini", "GET /models?pageSize=1", ["GET /models/{model}"]),
    ("ollama", "GET /api/tags", ["POST /api/show"]),
])
def test_each_builtin_adapter_is_asked_a_free_question(adapter: str, first: str, then: list[str]) -> None:
    p = plan("p", cfg(adapter), declared=None, keyed=True, models=[DEFAULT])
    assert p is not None and f"{p.first.method} {p.first.endpoint}" == first
    assert [f"{c.method} {c.endpoint}" for c in p.then] == then
    assert set(FAMILIES) == {"openai", "openai-responses", "deepseek", "openrouter", "anthropic", "gemini", "ollama"}


def test_custom_adapters_get_their_declared_probe_a_family_by_name_or_a_plain_reach() -> None:
    declared = plan("p", cfg("myhost"), declared="/v1/health", keyed=True, models=[DEFAULT])
    assert declared is not None and declared.first.endpoint == "/v1/health" and declared.declared
    assert plan("p", cfg("openai"), declared=None, keyed=True, models=[]).family is FAMILIES["openai"]  # type: ignore[union-attr]
    reach = plan("p", cfg("myhost"), declared=None, keyed=True, models=[DEFAULT])
    assert reach is not None and reach.family is None and reach.first == Call("GET", "") and reach.then == ()
    assert plan("p", cfg("myhost"), declared=False, keyed=True, models=[]) is None  # adapter.probe = false
    assert plan("p", cfg("openai", probe=False), declared=None, keyed=True, models=[]) is None  # probe = false
    # GitHub Models: the openai adapter, but the listing is the catalogue beside /inference
    gh = family_for("openai", "https://models.github.ai/inference", None)
    assert gh is not None and gh.key == "https://models.github.ai/catalog/models" and not gh.proves_key


def judged(adapter: str, answer: Answer, *, keyed: bool = True, declared: str | None = None) -> Finding:
    p = plan("p", cfg(adapter), declared=declared, keyed=keyed, models=[])
    assert p is not None
    return judge_first(p, answer)


URL = "https://api.example.com/v1/models"


def test_a_connection_that_fails_is_an_error_saying_what_to_fix() -> None:
    refused = judged("openai", failed(URL, "refused"))
    assert refused.level == "error" and refused.text.startswith("[providers.p] base_url: connection refused at h:443")
    assert "start the provider's server, or fix base_url" in refused.text
    assert "does not resolve (DNS)" in judged("openai", failed(URL, "dns")).text
    tls = judged("anthropic", failed(URL, "tls"))
    assert tls.level == "error" and "check the scheme" in tls.text
    for what in ("connect_timeout", "unreachable"):
        assert judged("gemini", failed(URL, what)).level == "error"
    for what in ("read_timeout", "deadline"):  # it answered the connection: slow, not wrong
        assert judged("gemini", failed(URL, what)).level == "warning"
    # a custom adapter's plain reach fails the same way
    assert judged("myhost", failed(URL, "refused")).level == "error"


def test_http_answers_of_a_known_api_name_the_key_the_path_or_the_account() -> None:
    bad_key = judged("openai", failed(URL, "status", 401, "invalid_api_key"))
    assert bad_key == Finding("error", "[providers.p] api_key_env: the provider refused the key in $K (HTTP 401 "
                                       f"invalid_api_key on GET {URL}); export a valid key")
    assert "wants a key" in judged("openai", failed(URL, "status", 401), keyed=False).text
    assert "has no access (HTTP 403" in judged("anthropic", failed(URL, "status", 403, "permission_error")).text
    assert "no credit left (HTTP 402" in judged("openrouter", failed(URL, "status", 402)).text
    wrong_path = judged("gemini", failed(URL, "status", 404))
    assert wrong_path.level == "error" and "base_url's path is not the API root" in wrong_path.text
    assert "https://generativelanguage.googleapis.com/v1beta" in wrong_path.text and "probe = false" in wrong_path.text
    assert "probe path '/health' is not there" in judged("x", failed(URL, "status", 404), declared="/health").text
    assert judged("openai", failed(URL, "redirect", 301)).level == "error"
    web_page = judged("deepseek", failed(URL, "not_json", 200))
    assert web_page.level == "error" and "not the API (a web page?)" in web_page.text
    assert judged("openai", failed(URL, "status", 400)).level == "error"
    for status in (429, 500, 503):  # the provider is there, and busy or failing right now
        assert judged("openai", failed(URL, "status", status)).level == "warning"


def test_a_plain_reach_is_fine_with_any_answer_but_says_so_for_401() -> None:
    assert judged("myhost", failed(URL, "status", 404)).level == "ok"
    assert judged("myhost", failed(URL, "not_json", 200)).level == "ok"
    auth = judged("myhost", failed(URL, "status", 401))
    assert auth.level == "warning" and "declare adapter.probe" in auth.text
    assert judged("myhost", Answer(URL, body=b"{}")).level == "ok"


def listing(*ids: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()


def models_of(adapter: str, base_url: str, body: bytes, *models: str) -> list[Finding]:
    defaults = [DefaultModel(m, "[defaults] model") for m in models]
    p = plan("p", cfg(adapter, base_url), declared=None, keyed=True, models=defaults)
    assert p is not None
    first = Answer(base_url + p.first.endpoint, body=body)
    answers = [(c, Answer(base_url + c.endpoint, body=body)) for c in p.then]
    return judge_models(p, defaults, answers, first)


def test_a_model_missing_from_the_providers_own_listing_is_an_error_elsewhere_a_warning() -> None:
    body = listing("gpt-4o-mini", "gpt-4.1", "ft:gpt-4o-mini:acme::x1")
    [own] = models_of("openai", "https://api.openai.com/v1", body, "gpt-4o-mni")
    assert own.level == "error" and "'gpt-4o-mni' is not among the 3 models" in own.text
    assert "(close: gpt-4o-mini" in own.text
    [proxy] = models_of("openai", "https://llm.internal.example/v1", body, "gpt-4o-mni")
    assert proxy.level == "warning" and "a proxy or compatible host may accept ids it does not list" in proxy.text
    listed = models_of("openai", "https://api.openai.com/v1", body, "gpt-4.1", "ft:gpt-4o-mini:acme::x1")
    assert [f.level for f in listed] == ["ok", "ok"]  # fine-tunes are in the listing
    [ds] = models_of("deepseek", "https://api.deepseek.com", listing("deepseek-chat"), "deepseek-chat-v9")
    assert ds.level == "error"


def test_openrouter_variants_and_presets_are_read_as_openrouter_means_them() -> None:
    body = listing("anthropic/claude-sonnet-4", "meta-llama/llama-3.3-70b-instruct:free")
    found = models_of("openrouter", "https://openrouter.ai/api/v1", body, "anthropic/claude-sonnet-4:nitro",
                      "meta-llama/llama-3.3-70b-instruct:free", "@preset/mine", "anthropic/claude-sonet-4")
    assert [f.level for f in found] == ["ok", "ok", "ok", "warning"]  # OpenRouter: never an error


def test_a_lookup_404_is_an_error_and_ollama_says_to_pull() -> None:
    p = plan("p", cfg("ollama"), declared=None, keyed=False, models=[DEFAULT])
    assert p is not None
    miss = failed("http://127.0.0.1:11434/api/show", "status", 404)
    [f] = judge_models(p, [DEFAULT], [(p.then[0], miss)], Answer("http://127.0.0.1:11434/api/tags", body=b"{}"))
    assert f.level == "error" and "'m-1' is not pulled on h:443" in f.text and "'ollama pull m-1'" in f.text
    g = plan("p", cfg("gemini"), declared=None, keyed=True, models=[DEFAULT])
    assert g is not None
    [nf] = judge_models(g, [DEFAULT], [(g.then[0], failed(URL, "status", 404, "NOT_FOUND"))], Answer(URL, body=b"{}"))
    assert nf.level == "error" and "is not offered by h:443 (HTTP 404 NOT_FOUND" in nf.text
    [slow] = judge_models(g, [DEFAULT], [(g.then[0], failed(URL, "status", 503))], Answer(URL, body=b"{}"))
    assert slow.level == "warning"


def test_a_base_url_that_is_no_url_is_named_without_its_query() -> None:
    from gelbridge._errors import ConfigError

    p = plan("p", cfg("gemini", "generativelanguage.googleapis.com/v1beta?key=AIza-secret"), declared=None,
             keyed=True, models=[])
    assert p is not None
    f = judge_first(p, Answer(p.cfg.base_url, error=ConfigError("base_url '...?key=AIza-secret' is not a URL")))
    assert f.level == "error" and "secret" not in f.text and "is not an http(s) URL with a host" in f.text


def test_shown_urls_drop_user_info_and_query_where_keys_hide() -> None:
    assert shown("https://u:secret@h.example/v1beta/models?key=AIza-secret&pageSize=1") == "https://h.example/v1beta/models"


def test_default_models_are_collected_from_defaults_and_accounts() -> None:
    s = Settings.model_validate({
        "defaults": {"model": {"provider": "a", "id": "m1"}},
        "accounts": [{"identifier": "x.test", "name": "x", "defaults": {"model": {"provider": "a", "id": "m2"}}},
                     {"identifier": "y.test", "defaults": {"model": {"provider": "b", "id": "m1"}}}],
    })
    assert default_models(s) == {
        "a": [DefaultModel("m1", "[defaults] model"), DefaultModel("m2", "[[accounts]] x defaults model")],
        "b": [DefaultModel("m1", "[[accounts]] y.test defaults model")]}


def test_a_plan_is_data() -> None:
    p = plan("p", cfg("anthropic"), declared=None, keyed=True, models=[DEFAULT])
    assert isinstance(p, Plan) and p.then[0].model == DEFAULT and p.keyed
