"""The native (pydantic-core) checks accept and reject exactly what the Python checks did.

Each fast path is compared with a copy of the plain-Python check it replaced, which is
kept here as the reference.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import SchemaValidator, core_schema

from gelbridge._errors import RecordError
from gelbridge._records import MessageRecord, PlainContent, TextPart, ToolCallPart, UnknownPart
from gelbridge._records.codec import b64decode, bytes_validator
from gelbridge._records.models import DATETIME_PATTERN, URI_PATTERN

# --- datetime ----------------------------------------------------------------------------

_REF_DATETIME_RE = re.compile(
    r"[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-6][0-9]:[0-6][0-9](\.[0-9]{1,20})?"
    r"(Z|[+-][0-2][0-9]:[0-5][0-9])"
)


def reference_datetime_ok(s: str) -> bool:
    """The check the datetime pattern replaced: regex shape, then a calendar check."""
    if len(s) > 64 or not _REF_DATETIME_RE.fullmatch(s) or s.endswith("-00:00"):
        return False
    try:
        datetime.fromisoformat(s[:19])
    except ValueError:
        return False
    return True


def datetime_ok(s: str) -> bool:
    try:
        MessageRecord.from_value({"conversation": "c", "role": "user", "createdAt": s,
                                  "content": {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}})
    except RecordError as e:
        assert "createdAt" in str(e)
        return False
    return True


class _RustPattern:
    """A pattern as pydantic-core runs it (the Rust regex engine)."""

    def __init__(self, pattern: str) -> None:
        self._v = SchemaValidator(core_schema.str_schema(pattern=pattern, strict=True))

    def fullmatch(self, s: str) -> bool:
        try:
            self._v.validate_python(s)
        except ValidationError:
            return False
        return True


_PATTERN = _RustPattern(DATETIME_PATTERN)


def test_datetime_pattern_agrees_on_every_day_of_leap_and_other_years() -> None:
    # every month 00-19 and day 00-39 of years around every leap-year rule
    years = [0, 1, 4, 99, 100, 400, 1600, 1700, 1800, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9996, 9999]
    for y, m, d in itertools.product(years, range(20), range(40)):
        s = f"{y:04d}-{m:02d}-{d:02d}T00:00:00Z"
        assert bool(_PATTERN.fullmatch(s)) == reference_datetime_ok(s), s
    for y in range(10000):  # 29 February of every year
        s = f"{y:04d}-02-29T12:00:00.5+01:00"
        assert bool(_PATTERN.fullmatch(s)) == reference_datetime_ok(s), s


def test_datetime_pattern_agrees_on_times_zones_and_fractions() -> None:
    for h, mi in itertools.product(range(30), range(70)):
        for s in (f"2024-02-29T{h:02d}:{mi:02d}:00Z", f"2024-02-29T00:{h:02d}:{mi:02d}Z"):
            assert bool(_PATTERN.fullmatch(s)) == reference_datetime_ok(s), s
    for sign, h, mi in itertools.product("+-Z", range(30), range(60)):
        s = f"2024-01-01T00:00:00.1{sign}{h:02d}:{mi:02d}"
        assert bool(_PATTERN.fullmatch(s)) == reference_datetime_ok(s), s
    for n in range(23):
        s = "2024-01-01T00:00:00" + ("." + "7" * n if n else "") + "Z"
        assert bool(_PATTERN.fullmatch(s)) == reference_datetime_ok(s), s


@pytest.mark.parametrize(
    "s",
    [
        "2025-01-31T12:00:00Z", "2025-01-31T12:00:00.123456+02:00", "2024-02-29T23:59:59.999Z",
        "2025-02-29T00:00:00Z", "2025-04-31T00:00:00Z", "0000-01-01T00:00:00Z", "2025-01-31T24:00:00Z",
        "2025-01-31T12:60:00Z", "2025-01-31T12:00:60Z", "2025-01-31T12:00:00-00:00", "2025-01-31T12:00:00",
        "2025-01-31", "yesterday", "2025-01-31T12:00:00Z\n", " 2025-01-31T12:00:00Z", "2025-01-31t12:00:00z",
        "2025-01-31T12:00:00.Z", "2025-01-31T12:00:00.123456789012345678901Z", "２０２５-01-31T12:00:00Z",
        "2025-01-31T12:00:00+0100", "2025-01-31 12:00:00Z", "",
    ],
)
def test_datetime_fields_accept_exactly_what_the_python_check_accepted(s: str) -> None:
    assert datetime_ok(s) == reference_datetime_ok(s)


@settings(max_examples=300)
@given(st.text(alphabet="0123456789-:TZ+.z ", min_size=15, max_size=40))
def test_datetime_fields_agree_on_near_misses(s: str) -> None:
    assert datetime_ok(s) == reference_datetime_ok(s)


def test_datetime_errors_name_the_field_not_the_value() -> None:
    with pytest.raises(RecordError, match="field createdAt: not an atproto datetime") as ei:
        MessageRecord.from_value({"conversation": "c", "role": "user", "createdAt": "2025-02-30T00:00:00Z-MARK",
                                  "content": {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}})
    assert "MARK" not in str(ei.value)


# --- bytes -------------------------------------------------------------------------------


def reference_b64decode(text: str) -> bytes:
    """The decoder before the libipld fast path (standard base64, padding optional)."""
    text = text.rstrip("=")
    try:
        return binascii.a2b_base64(text + "=" * (-len(text) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        raise ValueError("$bytes is not standard base64") from None


def same_decoding(text: str) -> None:
    try:
        want: bytes | None = reference_b64decode(text)
    except ValueError:
        want = None
    try:
        got: bytes | None = b64decode(text)
    except ValueError:
        got = None
    assert got == want, repr(text)


def test_b64decode_agrees_with_binascii_on_all_short_strings() -> None:
    for n in range(6):
        for chars in itertools.product("AQgw/+=_-", repeat=n):
            same_decoding("".join(chars))


@settings(max_examples=500)
@given(st.one_of(
    st.binary(max_size=80).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=80).map(lambda b: base64.b64encode(b).decode().rstrip("=")),
    st.text(alphabet="ABCQgw09+/=-_ \n\u00e9", max_size=24),
))
def test_b64decode_agrees_with_binascii(text: str) -> None:
    same_decoding(text)


def test_bytes_fields_take_both_forms_and_enforce_the_limit() -> None:
    check = bytes_validator(4)
    assert check({"$bytes": "AQIDBA"}) == b"\x01\x02\x03\x04" == check(b"\x01\x02\x03\x04")
    assert check(bytearray(b"ab")) == b"ab" and check(memoryview(b"ab")) == b"ab"
    for bad in ({"$bytes": "AQIDBAU"}, b"12345", "AQID", {"$bytes": "AQ", "x": 1}, {"$link": "x"}, {"$bytes": 5}, 5, None):
        with pytest.raises(ValueError):
            check(bad)


# --- the parts union -------------------------------------------------------------------

T = "chat.gel.assistant.defs#textPart"


def parts_error(parts: list) -> str:
    with pytest.raises(RecordError) as ei:
        PlainContent.from_value({"parts": parts})
    return str(ei.value)


def test_known_parts_unknown_parts_and_instances() -> None:
    pc = PlainContent.from_value({"parts": [{"$type": T, "text": "a"}, {"$type": "x.y#z", "q": [1]}]})
    assert isinstance(pc.parts[0], TextPart) and isinstance(pc.parts[1], UnknownPart)
    # models built in code pass through as they are, an UnknownPart of a known $type too
    odd = UnknownPart.from_value({"$type": T, "text": "kept as unknown"})
    built = PlainContent(parts=[pc.parts[0], pc.parts[1], odd])
    assert built.parts[0] is pc.parts[0] and built.parts[2] is odd


@pytest.mark.parametrize(
    "part,message",
    [
        ({"$type": T}, "field parts[0].text: Field required"),
        ({"$type": "chat.gel.assistant.defs#toolCallPart", "callId": "c", "tool": "t"}, "field parts[0].input: Field required"),
        ({"text": "x"}, "field parts[0]: a part needs a $type string"),
        ({"type": T, "text": "x"}, "field parts[0]: a part needs a $type string"),
        ({"$type": 5}, "field parts[0]: a part needs a $type string"),
        ({"$type": ""}, "field parts[0]: a part needs a $type string"),
        ("a string", "field parts[0]: a part needs a $type string"),
        ({"$type": "x" * 513}, "field parts[0].$type: must be a valid UTF-8 string of at most 512 UTF-8 bytes"),
    ],
)
def test_a_bad_part_fails_as_itself_with_one_clear_message(part: object, message: str) -> None:
    msg = parts_error([part])
    assert msg.endswith(message), msg


def test_a_malformed_known_part_never_becomes_an_unknown_part() -> None:
    for cls, bad in ((TextPart, {"text": 5}), (ToolCallPart, {"callId": "c"})):
        with pytest.raises(RecordError):
            PlainContent.from_value({"parts": [{"$type": cls.LEXICON_TYPE, **bad}]})


def test_content_union_messages() -> None:
    base = {"conversation": "c", "role": "user", "createdAt": "2026-01-01T00:00:00Z"}
    for content in ({"parts": []}, {"$type": "x.y"}, "a string", {"type": "chat.gel.assistant.defs#plainContent", "parts": []}):
        with pytest.raises(RecordError, match=r"field content: \$type must be chat\.gel\.assistant\.defs#encryptedContent or"):
            MessageRecord.from_value({**base, "content": content})


# --- no value from the input in an error message ------------------------------------------

MARK = "Zq9MARKER"
CID = "bafyreihltcnuuyqp2jm24aqydpnlj7b6w3ogwrplomrjtg5rifv44mmjey"


def _blob(mime: str = "image/png", size: int = 1) -> dict:
    return {"$type": "blob", "ref": {"$link": CID}, "mimeType": mime, "size": size}


@pytest.mark.parametrize(
    "part",
    [
        {"$type": "chat.gel.assistant.defs#imagePart", "image": _blob(f"image/{MARK}")},
        {"$type": "chat.gel.assistant.defs#imagePart", "image": _blob(f"{MARK}/x")},
        {"$type": "chat.gel.assistant.defs#filePart", "file": _blob(), "extracted": {"text": _blob(MARK), "method": "ocr"}},
        {"$type": "chat.gel.assistant.defs#imagePart", "image": {**_blob(), "ref": {"$link": MARK}}},
        {"$type": "chat.gel.assistant.defs#imagePart", "image": {**_blob(), "ref": MARK}},
        {"$type": "chat.gel.assistant.defs#imagePart", "image": {**_blob(), "size": MARK}},
        {"$type": "chat.gel.assistant.defs#sourcePart", "url": f"no scheme {MARK}"},
        {"$type": "chat.gel.assistant.defs#textPart", "text": MARK * 60000},
        {"$type": "chat.gel.assistant.defs#textPart", "text": 5, "providerData": [MARK]},
        {"$type": "chat.gel.assistant.defs#toolResultPart", "callId": "c", "output": "o", "isError": MARK},
        {"$type": "chat.gel.assistant.defs#toolApprovalPart", "callId": "c", "approved": MARK},
        {"$type": MARK * 100},
        {"$type": "chat.gel.assistant.defs#textPart" + MARK},
        MARK,
    ],
)
def test_validation_errors_never_echo_a_value_from_the_input(part: object) -> None:
    """Sealed content's errors end up in an unsealed reply's error.message."""
    try:
        PlainContent.from_value({"parts": [part]})
    except RecordError as e:
        assert MARK not in str(e), str(e)
    else:
        assert isinstance(part, dict) and part["$type"].startswith(MARK) is False


@pytest.mark.parametrize(
    "change",
    [
        {"$type": MARK},
        {"createdAt": MARK},
        {"conversation": MARK * 100},
        {"content": {"$type": MARK}},
        {"content": {"$type": "chat.gel.assistant.defs#encryptedContent", "scheme": "s", "keyId": "k",
                     "nonce": {"$bytes": MARK}, "ciphertext": {"$bytes": "AAAA"}}},
        {"generation": {"attempt": MARK}},
        {"usage": {"inputTokens": -1, "outputTokens": MARK}},
        {"error": {"kind": "k", "message": MARK * 400}},
    ],
)
def test_record_errors_never_echo_a_value_from_the_input(change: dict) -> None:
    value = {"$type": "chat.gel.assistant.message", "conversation": "c", "role": "user",
             "createdAt": "2026-01-01T00:00:00Z",
             "content": {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}, **change}
    with pytest.raises(RecordError) as ei:
        MessageRecord.from_value(value)
    assert MARK not in str(ei.value), str(ei.value)


# --- the record size bound --------------------------------------------------------------

import orjson  # noqa: E402

from gelbridge._records import MAX_RECORD_BYTES  # noqa: E402
from gelbridge._records.codec import cbor_size  # noqa: E402
from gelbridge._records.models import _bytes_as_blanks, _record_size  # noqa: E402

_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12) | st.binary(max_size=40)
_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=5)
    | st.dictionaries(st.text(max_size=6), kids, max_size=5)
    | st.builds(lambda s: {"$bytes": s}, st.text(max_size=12))
    | st.builds(lambda s: {"$link": s}, st.text(max_size=3) | st.integers()),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _values, max_size=6))
def test_cbor_size_is_bounded_by_the_json_length(value: dict) -> None:
    try:
        j = len(orjson.dumps(value, default=_bytes_as_blanks))
    except (TypeError, orjson.JSONEncodeError):
        return  # the exact path runs
    assert cbor_size(value) <= 4.5 * j + 4.5


def test_large_records_are_rejected_in_both_forms() -> None:
    base = {"$type": "chat.gel.assistant.message", "conversation": "c", "role": "user",
            "createdAt": "2026-01-01T00:00:00Z",
            "content": {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}}
    for big in ({"blob": b"\x00" * (MAX_RECORD_BYTES + 1)}, {"$bytes": "A" * (MAX_RECORD_BYTES * 4 // 3 + 8)},
                ["x" * 1000] * 1100, [b"\x01" * 1000] * 1100):
        with pytest.raises(RecordError, match="too large"):
            MessageRecord.from_value({**base, "future": big})
    assert _record_size({**base, "future": b"\x00" * 200_000}) == 0  # surely small: not walked
    assert MessageRecord.from_value({**base, "future": b"\x00" * 900_000})  # exact path: fits


# --- URIs -----------------------------------------------------------------------------------

from gelbridge._records import SourcePart  # noqa: E402

_REF_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]+")


def reference_uri_ok(s: str) -> bool:
    return len(s) <= 8192 and bool(_REF_URI_RE.fullmatch(s))


def uri_ok(s: str) -> bool:
    try:
        SourcePart.from_value({"url": s})
    except RecordError as e:
        assert "field url: not a URI" in str(e)
        return False
    return True


def test_uri_check_agrees_with_pythons_whitespace_on_every_character_below_u3100() -> None:
    native = _RustPattern(URI_PATTERN)
    for cp in [*range(0x3100), 0xFEFF, 0xFFFF, 0x1F600, 0xD800, 0x10FFFF]:
        c = chr(cp)
        for s in (f"a:{c}", f"https://x.y/{c}z", f"{c}a:b", f"a{c}b:c"):
            assert uri_ok(s) == reference_uri_ok(s), (hex(cp), s)
            if 0xD800 <= cp < 0xE000:
                continue  # Rust cannot read a lone surrogate: the Python check decides
            assert native.fullmatch(s) == reference_uri_ok(s), (hex(cp), s)  # the fast path decides alone


@pytest.mark.parametrize("s", ["at://did:plc:abc/x.y.z/1", "a:" + "b" * 8190, "a:" + "b" * 8191, "no scheme", "", ":x", "1a:b", "a:"])
def test_uri_limits(s: str) -> None:
    assert uri_ok(s) == reference_uri_ok(s)
