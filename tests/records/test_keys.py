"""Record keys, TIDs, reply keys and AT-URIs."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gelbridge._errors import RecordError
from gelbridge._records import (
    AtUri,
    check_rkey,
    is_tid,
    is_valid_rkey,
    new_tid,
    parse_reply_rkey,
    reply_rkey,
    tid_from_parts,
    tid_timestamp_micros,
)


def test_new_tids_are_valid_sortable_and_strictly_increasing() -> None:
    tids = [new_tid() for _ in range(2000)]
    assert all(len(t) == 13 and is_tid(t) for t in tids)
    assert tids == sorted(tids) and len(set(tids)) == len(tids)
    now = time.time_ns() // 1000
    assert abs(tid_timestamp_micros(tids[-1]) - now) < 5_000_000


@given(st.integers(0, (1 << 53) - 1), st.integers(0, 1023), st.integers(0, (1 << 53) - 1))
def test_tid_order_is_timestamp_order(a: int, clock: int, b: int) -> None:
    ta, tb = tid_from_parts(a, clock), tid_from_parts(b, clock)
    assert is_tid(ta) and tid_timestamp_micros(ta) == a
    assert (ta < tb) == (a < b)


def test_known_tid_encoding() -> None:
    assert tid_from_parts(0, 0) == "2222222222222"
    assert is_tid("3jzfcijpj2z2a") and is_tid("7777777777777")
    for bad in ("3jzfcijpj2z2", "3jzfcijpj2z2aa", "kjzfcijpj2z2a", "3jzfcijpj2z2A", "3jzfcijpj2z21"):
        assert not is_tid(bad), bad


def test_reply_keys_round_trip() -> None:
    assert reply_rkey("3mabcdefghij2", 0) == "3mabcdefghij2.r0"
    assert reply_rkey("3mabcdefghij2", 1000) == "3mabcdefghij2.r1000"
    assert parse_reply_rkey("3mabcdefghij2.r10") == ("3mabcdefghij2", 10)
    assert parse_reply_rkey("3mabcdefghij2") is None
    for bad in ("x.r01", "x.r1001", ".r1", "x.r-1", "x.r", "x.rx"):
        assert parse_reply_rkey(bad) is None, bad


@given(st.from_regex(r"[A-Za-z0-9_~:-][A-Za-z0-9._~:-]{0,40}", fullmatch=True), st.integers(0, 1000))
def test_any_reply_key_parses_back(base: str, n: int) -> None:
    assert parse_reply_rkey(reply_rkey(base, n)) == (base, n)


_REPLY_SPEC = re.compile(r"(.+)\.r(0|[1-9][0-9]{0,3})")


def _parse_reply_spec(rkey: str) -> tuple[str, int] | None:
    """The reply key rule written as one regex (the reference for parse_reply_rkey)."""
    m = _REPLY_SPEC.fullmatch(rkey)
    if m is None or int(m.group(2)) > 1000 or not is_valid_rkey(m.group(1)):
        return None
    return m.group(1), int(m.group(2))


_KEYISH = st.text(st.sampled_from(list("ar.r0.19_:~-é\n٣²")) | st.characters(), max_size=20)


@given(st.one_of(_KEYISH, st.builds(lambda a, b: a + ".r" + b, _KEYISH, _KEYISH),
                 st.builds(lambda a, n: f"{a}.r{n}", _KEYISH, st.integers(-5, 20000))))
def test_reply_key_parsing_agrees_with_the_regex_rule(rkey: str) -> None:
    assert parse_reply_rkey(rkey) == _parse_reply_spec(rkey)


def test_reply_key_parsing_edge_cases() -> None:
    for key, want in [("a.r0", ("a", 0)), ("a.r1000", ("a", 1000)), ("a.r.r2", ("a.r", 2)),
                      ("a.r2.r3", ("a.r2", 3)), ("a.r3x", None), ("a.r٣", None), ("a.r²", None),
                      ("a\n.r1", None), ("a.r1\n", None), ("a.r00", None), ("a.r10000", None),
                      ("a.r+1", None), ("a.r 1", None), (".r0", None), ("..r0", None), ("a.R1", None)]:
        assert parse_reply_rkey(key) == want == _parse_reply_spec(key), key


@pytest.mark.parametrize("attempt", [-1, 1001, True, 1.0])
def test_reply_key_rejects_bad_attempts(attempt: object) -> None:
    with pytest.raises(RecordError, match="attempt"):
        reply_rkey("3mabcdefghij2", attempt)  # type: ignore[arg-type]


def test_record_key_syntax() -> None:
    for good in ("self", "3mabcdefghij2.r0", "a:b~c_d-e", "x" * 512):
        assert is_valid_rkey(good) and check_rkey(good) == good
    for bad in ("", ".", "..", "a/b", "a b", "x" * 513, "é"):
        assert not is_valid_rkey(bad)
        with pytest.raises(RecordError, match="record key"):
            check_rkey(bad)


def test_at_uri_parse_and_format() -> None:
    s = "at://did:plc:abc123/chat.gel.assistant.message/3mabcdefghij2.r0"
    u = AtUri.parse(s)
    assert (u.did, u.collection, u.rkey) == ("did:plc:abc123", "chat.gel.assistant.message", "3mabcdefghij2.r0")
    assert str(u) == s and AtUri.parse(str(u)) == u
    assert str(u.with_rkey("k")) == "at://did:plc:abc123/chat.gel.assistant.message/k"


@pytest.mark.parametrize(
    "bad",
    [
        "did:plc:abc/chat.gel.assistant.message/k",
        "at://did:plc:abc/chat.gel.assistant.message",
        "at://did:plc:abc/chat.gel.assistant.message/k/extra",
        "at://alice.test/chat.gel.assistant.message/k",
        "at://did:plc:abc/notannsid/k",
        "at://did:plc:abc/chat.gel.assistant.message/a b",
        "at://did:plc:abc//k",
    ],
)
def test_at_uri_rejects_malformed(bad: str) -> None:
    with pytest.raises(RecordError, match="AT-URI|record key"):
        AtUri.parse(bad)
