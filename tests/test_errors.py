"""A provider failure's cause (``ProviderFault``) is safe for a log line by construction."""

from __future__ import annotations

import pytest

from gelbridge._errors import (
    FAULTS,
    REPLY_ERROR_KINDS,
    PdsError,
    ProviderError,
    ProviderFault,
    failure_of,
    known_code,
)
from gelbridge.lux import ErrorKind


def test_a_fault_says_what_happened_where_and_for_which_provider() -> None:
    f = ProviderFault("refused", host="127.0.0.1:9", provider="local")
    assert str(f) == "provider 'local': connection refused at 127.0.0.1:9"
    status = ProviderFault("status", host="api.openai.com:443", status=401, code="invalid_api_key", attempts=3)
    assert str(status) == "HTTP 401 from api.openai.com:443 (invalid_api_key), after 3 attempts"
    tls = ProviderFault("tls", host="h:443", detail="CERTIFICATE_VERIFY_FAILED")
    assert str(tls) == "TLS with h:443 failed (CERTIFICATE_VERIFY_FAILED)"
    assert all("{host}" in text for text in FAULTS.values())  # every fault names where


def test_a_code_outside_the_providers_vocabularies_is_never_kept() -> None:
    # a provider or proxy may put anything in its code field, even an echo of the prompt
    echoed = ProviderFault("status", host="h:1", status=400, code="secret words of the user")
    assert echoed.code is None and "secret" not in str(echoed)
    assert ProviderFault("status", status=400, code="cnryq7x9zkw4").code is None
    assert ProviderFault("status", status=404, code="model_not_found").code == "model_not_found"
    assert ProviderFault("status", status=401, code="UNAUTHENTICATED").code == "UNAUTHENTICATED"
    assert ProviderFault("status", status=401, code="401").code is None  # OpenRouter's code is the status again
    assert ProviderFault("status", status=402, code="429").code == "429"
    assert known_code(429) == "429" and known_code(True) is None and known_code("99") is None
    # the local cause's name is OpenSSL's or errno's fixed word, nothing else
    assert ProviderFault("tls", detail="wrong version number (x)").detail is None
    with pytest.raises(ValueError, match="unknown provider fault"):
        ProviderFault("whatever")


def test_failure_of_names_the_type_and_the_fault_never_the_message() -> None:
    e = ProviderError("provider answered HTTP 401: Incorrect API key provided: sk-abc***xyz; check the key",
                      kind="authentication", status=401,
                      fault=ProviderFault("status", host="h:443", status=401, code="invalid_api_key", provider="p"))
    assert failure_of(e) == "ProviderError: provider 'p': HTTP 401 from h:443 (invalid_api_key)"
    assert failure_of(ProviderError("no fault")) == "ProviderError"
    assert failure_of(PdsError("the PDS said something")) == "PdsError"


def test_at_fills_only_what_the_fault_lacks() -> None:
    f = ProviderFault("status", status=500)
    assert f.at(host="h:1", provider="p") == ProviderFault("status", host="h:1", status=500, provider="p")
    assert ProviderFault("cut", host="a:1").at(host="b:2").host == "a:1"


def test_every_lux_error_kind_is_a_reply_error_kind() -> None:
    assert {k.value for k in ErrorKind} <= REPLY_ERROR_KINDS
    assert {"decrypt_failed", "bad_record", "adapter_error", "tool_error", "timeout", "interrupted"} <= REPLY_ERROR_KINDS


def test_an_errors_kind_is_given_where_it_is_raised() -> None:
    from gelbridge._errors import ConfigError, GelbridgeError, RecordError

    e = GelbridgeError("no provider 'x' here", kind="invalid_request")
    assert e.kind == "invalid_request" and str(e) == "no provider 'x' here" and e.args == ("no provider 'x' here",)
    assert GelbridgeError("plain").kind == "bad_record" == GelbridgeError.kind  # the class's own, unchanged
    assert ConfigError("c").kind == "invalid_request" and RecordError("r", kind="server_error").kind == "server_error"
    assert RecordError.kind == "bad_record"
