"""The sealed OAuth session row: round trip, nothing secret in the clear, and a row that
moved, was altered or meets another secret does not open."""

from __future__ import annotations

import base64
import json

import pytest

from gelbridge._errors import OAuthError
from gelbridge._oauth.jose import EcKey
from gelbridge._oauth.session import (
    SECRET_ENV,
    OAuthSession,
    is_oauth_row,
    new_secret,
    open_session,
    operator_secret,
    seal_session,
)

SECRET = base64.b64decode(new_secret())


def session() -> OAuthSession:
    return OAuthSession(did="did:plc:abc", pds_url="https://pds.example", issuer="https://auth.example",
                        client_id="https://bot.example/client-metadata.json", scope="atproto repo:x.y.z",
                        access_token="at-secret-123", refresh_token="rt-secret-456", expires_at=2000.0,
                        dpop_key=EcKey.generate(), created_at=1000.0, refreshed_at=1500.0, assertion_kid="k1")


def test_round_trip_and_nothing_secret_in_the_clear() -> None:
    s = session()
    row = seal_session(s, account="alice.example", secret=SECRET)
    text = json.dumps(row)
    for secret in ("at-secret-123", "rt-secret-456", s.dpop_key.private_jwk()["d"]):
        assert secret not in text and secret not in repr(s)
    assert is_oauth_row(row) and not is_oauth_row({"accessJwt": "x"}) and not is_oauth_row(None)
    back = open_session(json.loads(text), account="alice.example", secret=SECRET)
    assert back.access_token == s.access_token and back.refresh_token == s.refresh_token
    assert back.dpop_key.thumbprint() == s.dpop_key.thumbprint() and back.assertion_kid == "k1"
    marked = open_session(seal_session(s.with_state("reauth_needed", 1600.0, "replayed"), account="a",
                                       secret=SECRET), account="a", secret=SECRET)
    assert (marked.state, marked.state_since, marked.reason) == ("reauth_needed", 1600.0, "replayed")


@pytest.mark.parametrize("change", [
    {"did": "did:plc:other"}, {"pds": "https://evil.example"}, {"issuer": "https://evil.example"},
    {"client_id": "https://evil.example/c.json"}, {"assertion_kid": "k2"}])
def test_a_changed_routing_field_does_not_open(change: dict[str, str]) -> None:
    row = {**seal_session(session(), account="alice.example", secret=SECRET), **change}
    with pytest.raises(OAuthError, match="does not open"):
        open_session(row, account="alice.example", secret=SECRET)


def test_another_account_or_secret_does_not_open_and_malformed_rows_are_refused() -> None:
    row = seal_session(session(), account="alice.example", secret=SECRET)
    with pytest.raises(OAuthError, match="does not open"):
        open_session(row, account="bob.example", secret=SECRET)
    with pytest.raises(OAuthError, match="does not open"):
        open_session(row, account="alice.example", secret=base64.b64decode(new_secret()))
    for bad in ({**row, "sealed": "!!"}, {**row, "v": 2}, {k: v for k, v in row.items() if k != "scope"},
                {**row, "state": "whatever"}):
        with pytest.raises(OAuthError):
            open_session(bad, account="alice.example", secret=SECRET)


def test_operator_secret_from_the_environment() -> None:
    assert len(operator_secret({SECRET_ENV: new_secret()})) == 32
    for env, why in (({}, "set"), ({SECRET_ENV: "not base64!"}, "not base64"),
                     ({SECRET_ENV: base64.b64encode(b"short").decode()}, "32 bytes")):
        with pytest.raises(OAuthError, match=why):
            operator_secret(env)
