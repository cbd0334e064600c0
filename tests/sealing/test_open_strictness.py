"""What ``open_content`` accepts from a decrypted plaintext: exactly what ``orjson.loads``
accepts, validated as ``PlainContent``.

These pin the JSON strictness that any faster open path must keep. pydantic's own JSON
parser (jiter, behind ``validate_json``) accepts ``NaN``/``Infinity``/``-Infinity`` and
numbers beyond double range, reads integers beyond 64 bits as ``int`` where orjson makes
them ``float``, and stops at 200 levels of nesting where orjson allows 1024: every
plaintext below where the two differ is here, with today's outcome.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sealing_uris import URI

from gelbridge._errors import (
    DecryptError,
    MalformedSealError,
    MovedCiphertextError,
    RecordError,
    UnknownKeyError,
    UnknownSchemeError,
)
from gelbridge._records import PlainContent
from gelbridge._records.models import EncryptedContent, record_error
from gelbridge._records.nesting import MAX_DEPTH
from gelbridge._sealing import SCHEME, Keyring, _encrypt, open_content, seal_content

PC = '"$type":"chat.gel.assistant.defs#plainContent"'
TEXT = '"$type":"chat.gel.assistant.defs#textPart"'
NOT_JSON = f"sealed content of {URI} is not UTF-8 JSON"
NOT_OBJECT = f"sealed content of {URI} is not a JSON object"


def sealed(plaintext: bytes, ring: Keyring) -> EncryptedContent:
    nonce = bytes(range(24))
    ct = _encrypt(plaintext, f"{SCHEME}\n{URI}\nk1".encode(), nonce, ring["k1"])
    return EncryptedContent(scheme=SCHEME, key_id="k1", nonce=nonce, ciphertext=ct)


def outcome(fn) -> tuple:  # noqa: ANN001
    try:
        return ("ok", fn())
    except RecordError as e:
        return ("error", type(e), str(e))


def reference(plaintext: bytes) -> tuple:
    """The specified meaning: orjson's JSON, an object, validated as a plainContent."""

    def run() -> PlainContent:
        try:
            value = orjson.loads(plaintext)
        except orjson.JSONDecodeError:
            raise RecordError(NOT_JSON) from None
        if not isinstance(value, dict):
            raise RecordError(NOT_OBJECT)
        try:
            return PlainContent.__pydantic_validator__.validate_python(value, by_alias=True, by_name=False)
        except ValidationError as e:
            raise record_error(e, f"record {URI} (sealed content)") from None

    return outcome(run)


def doc(*members: str, parts: str = "[]") -> bytes:
    return ("{" + ",".join((PC, f'"parts":{parts}', *members)) + "}").encode()


def text_part(*members: str) -> str:
    return "[{" + ",".join((TEXT, *members)) + "}]"


def nested(depth: int) -> str:
    return "[" * (depth - 1) + "{}" + "]" * (depth - 1)


REJECTED = [
    pytest.param(doc('"n":NaN'), id="NaN"),
    pytest.param(doc('"n":Infinity'), id="Infinity"),
    pytest.param(doc('"n":-Infinity'), id="-Infinity"),
    pytest.param(doc('"n":[1,NaN]'), id="NaN-in-array"),
    pytest.param(doc('"n":1e400'), id="exponent-overflow"),
    pytest.param(doc('"n":-1E+309'), id="negative-exponent-overflow"),
    pytest.param(doc('"n":1' + "0" * 400), id="integer-beyond-double"),
    pytest.param(doc('"n":1' + "0" * 400 + ".5"), id="decimal-beyond-double"),
    pytest.param(doc(parts=text_part('"text":NaN', '"text":"kept"')), id="NaN-in-overwritten-duplicate"),
    pytest.param(doc('"n":1e999', '"n":1'), id="overflow-in-overwritten-duplicate"),
    pytest.param(doc(parts=text_part('"text":"\\ud800"')), id="lone-high-surrogate"),
    pytest.param(doc(parts=text_part('"text":"\\udc00"')), id="lone-low-surrogate"),
    pytest.param(doc(parts=text_part('"text":"\\ud800\\u0041"')), id="high-surrogate-then-non-surrogate"),
    pytest.param(doc('"s":"\\udc00\\ud800"'), id="reversed-surrogate-pair"),
    pytest.param(doc('"s":"\xff"').replace(b"\xc3\xbf", b"\xff"), id="invalid-utf8-byte"),
    pytest.param(doc('"s":"x"').replace(b'"x"', b'"\xed\xa0\x80"'), id="utf8-encoded-surrogate"),
    pytest.param(doc('"s":"x"').replace(b'"x"', b'"\xc0\x80"'), id="overlong-utf8"),
    pytest.param(b"\xef\xbb\xbf" + doc(), id="byte-order-mark"),
    pytest.param(doc() + b"x", id="trailing-data"),
    pytest.param(doc() + b"{}", id="second-document"),
    pytest.param(doc() + b"\x00", id="trailing-nul"),
    pytest.param(b"\x0c" + doc(), id="form-feed-is-not-json-whitespace"),
    pytest.param(doc('"s":"a\x01b"'), id="raw-control-character"),
    pytest.param(doc('"s":"a\tb"'), id="raw-tab"),
    pytest.param(doc('"s":"\\x41"'), id="bad-escape"),
    pytest.param(doc('"n":01'), id="leading-zero"),
    pytest.param(doc('"n":1.'), id="no-fraction-digits"),
    pytest.param(doc('"n":+1'), id="plus-sign"),
    pytest.param(doc('"n":[1,]'), id="trailing-comma-array"),
    pytest.param(doc('"n":1,'), id="trailing-comma-object"),
    pytest.param(b"", id="empty"),
    pytest.param(b"NaN", id="top-level-NaN"),
]


@pytest.mark.parametrize("plaintext", REJECTED)
def test_plaintexts_orjson_rejects_are_not_json(ring: Keyring, plaintext: bytes) -> None:
    with pytest.raises(RecordError) as ei:
        open_content(sealed(plaintext, ring), uri=URI, keyring=ring)
    assert str(ei.value) == NOT_JSON


@pytest.mark.parametrize("plaintext", [b"[]", b'"s"', b"1", b"null", b"true", b" [1] "])
def test_plaintexts_that_are_not_objects(ring: Keyring, plaintext: bytes) -> None:
    with pytest.raises(RecordError) as ei:
        open_content(sealed(plaintext, ring), uri=URI, keyring=ring)
    assert str(ei.value) == NOT_OBJECT


def opened(ring: Keyring, plaintext: bytes) -> PlainContent:
    return open_content(sealed(plaintext, ring), uri=URI, keyring=ring)


def test_integers_beyond_64_bits_become_floats_as_orjson_reads_them(ring: Keyring) -> None:
    pc = opened(ring, doc(f'"big":{2**64}', f'"small":{-(2**63) - 1}', f'"max":{2**64 - 1}', f'"min":{-(2**63)}'))
    extra = pc.model_extra
    assert type(extra["big"]) is float and extra["big"] == float(2**64)
    assert type(extra["small"]) is float and extra["small"] == float(-(2**63) - 1)
    assert type(extra["max"]) is int and extra["max"] == 2**64 - 1
    assert type(extra["min"]) is int and extra["min"] == -(2**63)


def test_numbers_orjson_accepts(ring: Keyring) -> None:
    pc = opened(ring, doc('"a":1e-400', '"b":-0', '"c":-0.0', '"d":0.1e1', '"e":2.2250738585072011e-308', '"f":9007199254740993'))
    assert pc.model_extra == {"a": 0.0, "b": 0, "c": -0.0, "d": 1.0, "e": 2.2250738585072011e-308, "f": 9007199254740993}
    assert type(pc.model_extra["b"]) is int and str(pc.model_extra["c"]) == "-0.0"


def test_duplicate_keys_last_one_wins(ring: Keyring) -> None:
    pc = opened(ring, doc('"x":1', '"x":"two"', parts=text_part('"text":"first"', '"text":"last"')))
    assert pc.parts[0].text == "last" and pc.model_extra == {"x": "two"}
    pc = opened(ring, ("{" + PC + ',"parts":' + text_part('"text":"a"') + ',"parts":[]}').encode())
    assert pc.parts == []
    # a duplicate ``$type`` decides the part's kind by its last value
    pc = opened(ring, doc(parts='[{"$type":"x.y#z",' + TEXT + ',"text":"t"}]'))
    assert pc.parts[0].text == "t"


def test_escapes_surrogate_pairs_and_whitespace(ring: Keyring) -> None:
    pc = opened(ring, b" \t\r\n" + doc(parts=text_part('"t\\u0065xt" : "a\\ud83d\\ude00\\u0000\\/\\n\x7fé"')) + b" \n")
    assert pc.parts[0].text == "a\U0001f600\x00/\n\x7fé"


def test_nesting_up_to_the_limit_is_accepted(ring: Keyring) -> None:
    pc = opened(ring, doc(f'"deep":{nested(MAX_DEPTH - 1)}'))  # the content object is level 1
    depth, v = 0, pc.model_extra["deep"]
    while isinstance(v, list):
        depth, v = depth + 1, v[0]
    assert depth == MAX_DEPTH - 2 and v == {}


@pytest.mark.parametrize("levels", [MAX_DEPTH, 300, 1100, 100_000])
def test_nesting_past_the_limit_is_a_record_error_before_anything_recurses(ring: Keyring, levels: int) -> None:
    """Past gelbridge's nesting limit (and past orjson's 1,024 and Python's recursion
    limit) sealed content is ``bad_record``: one clear error, never RecursionError."""
    with pytest.raises(RecordError) as ei:
        open_content(sealed(doc(f'"deep":{nested(levels)}'), ring), uri=URI, keyring=ring)
    assert str(ei.value) == f"sealed content of {URI} is nested deeper than {MAX_DEPTH} levels (gelbridge's limit)"
    assert ei.value.kind == "bad_record"


def test_field_errors_name_the_field(ring: Keyring) -> None:
    with pytest.raises(RecordError) as ei:
        opened(ring, doc(parts=text_part('"text":1.5')))
    assert str(ei.value).startswith(f"record {URI} (sealed content): field parts[0].text: ")
    with pytest.raises(RecordError) as ei:
        opened(ring, doc(parts='[{"$type":"chat.gel.assistant.defs#toolResultPart","callId":"c","output":"o","isError":1}]'))
    assert str(ei.value).startswith(f"record {URI} (sealed content): field parts[0].isError: ")


# --- generated plaintexts -----------------------------------------------------------------

ODD_NUMBERS = [
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E+309", "1" + "0" * 310, "18446744073709551616",
    "18446744073709551615", "-9223372036854775809", "-9223372036854775808", "1.5", "-0", "-0.0", "0.1e1",
    "1e-400", "2.2250738585072011e-308", "01", "1.", ".5", "+1", "0", "7",
]
ODD_STRINGS = [
    '"x"', '"\\ud800"', '"\\udc00"', '"\\ud83d\\ude00"', '"a\\u0000b"', '"\\n"', '"a\\"b"', '"\\/"', '"\\x"',
    '"\x01"', '"\x7f"', '"\xe9"', '"\\u00e9"', '""',
]
ODD_BYTES = [b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\x80"', b'"\xf4\x90\x80\x80"']
WS = ["", "", "", " ", "\n", "\t", "\r", "\x0c", "\xa0"]  # the last two are not JSON whitespace
PART_TYPES = ["textPart", "reasoningPart", "toolCallPart", "toolResultPart", "toolApprovalPart", "sourcePart", "imagePart"]
KEYS = ["text", "text", "providerData", "callId", "tool", "input", "output", "isError", "approved", "url", "x", "$type"]

ws = st.sampled_from(WS).map(str.encode)
valid_strings = st.text(max_size=12).map(lambda s: orjson.dumps(s) if not any(0xD800 <= ord(c) < 0xE000 for c in s) else b'"s"')
ok_numbers = st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()) | st.floats(allow_nan=False, allow_infinity=False).map(orjson.dumps)
plain_scalars = st.one_of(valid_strings, ok_numbers, st.sampled_from([b"true", b"false", b"null", b'"https://example.com/a"']))
odd_scalars = st.one_of(
    st.sampled_from(ODD_NUMBERS).map(str.encode),
    st.sampled_from(ODD_STRINGS).map(lambda s: s.encode("utf-8")),
    st.sampled_from(ODD_BYTES),
)
scalars = st.one_of(*[plain_scalars] * 5, odd_scalars)  # one leaf in six is odd


def _array(items: list[bytes], sep: bytes) -> bytes:
    return b"[" + sep.join(items) + b"]"


def _object(members: list[tuple[bytes, bytes]], sep: bytes) -> bytes:
    return b"{" + sep.join(k + b":" + v for k, v in members) + b"}"


values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.builds(_array, st.lists(inner, max_size=3), st.sampled_from([b",", b" , "])),
        st.builds(_object, st.lists(st.tuples(valid_strings, inner), max_size=3), st.sampled_from([b",", b", "])),
    ),
    max_leaves=6,
)
keys = st.sampled_from(KEYS).map(lambda k: orjson.dumps(k)) | valid_strings
part_values = st.one_of(valid_strings, valid_strings, values)


@st.composite
def parts(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(PART_TYPES) | st.just("x.y#z"))
    tag = kind if "#" in kind else f"chat.gel.assistant.defs#{kind}"
    members = [(b'"$type"', orjson.dumps(tag))]
    members += draw(st.lists(st.tuples(keys, part_values), max_size=5))
    order = draw(st.permutations(range(len(members))))
    return _object([members[i] for i in order], draw(st.sampled_from([b",", b" ,\n"])))


@st.composite
def plaintexts(draw: st.DrawFn) -> bytes:
    members = []
    if draw(st.booleans()):
        members.append((b'"$type"', b'"chat.gel.assistant.defs#plainContent"'))
    members.append((b'"parts"', _array(draw(st.lists(parts(), max_size=3)), b",")))
    members += draw(st.lists(st.tuples(keys, values), max_size=3))
    order = draw(st.permutations(range(len(members))))
    body = _object([members[i] for i in order], b",")
    if draw(st.booleans()):  # whitespace between tokens, sometimes not JSON whitespace
        body = body.replace(b":", draw(ws) + b":" + draw(ws), 1).replace(b",", b"," + draw(ws), 1)
    prefix = draw(st.sampled_from([b""] * 6 + [b" ", b"\xef\xbb\xbf", b"\n"]))
    suffix = draw(st.sampled_from([b""] * 6 + [b" \n", b"x", b"{}", b"\x00"]))
    out = prefix + body + suffix
    if draw(st.integers(0, 9)) == 0 and out:  # a flipped byte somewhere
        i = draw(st.integers(0, len(out) - 1))
        out = out[:i] + bytes([out[i] ^ draw(st.integers(1, 255))]) + out[i + 1 :]
    return out


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plaintext=plaintexts())
def test_open_content_means_orjson_then_plain_content(ring: Keyring, plaintext: bytes) -> None:
    assert outcome(lambda: open_content(sealed(plaintext, ring), uri=URI, keyring=ring)) == reference(plaintext)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40), n=st.integers(1, 5))
def test_sealed_content_opens_to_itself(ring: Keyring, text: str, n: int) -> None:
    pc = PlainContent.from_value({"parts": [{"$type": "chat.gel.assistant.defs#textPart", "text": text}] * n})
    try:
        enc = seal_content(pc, uri=URI, key_id="k1", keyring=ring)
    except RecordError:  # a lone surrogate cannot be sealed
        assert any(0xD800 <= ord(c) < 0xE000 for c in text)
        return
    assert open_content(enc, uri=URI, keyring=ring) == pc


@pytest.mark.parametrize("as_mapping", [False, True], ids=["Keyring", "plain-mapping"])
def test_open_content_errors_for_any_keyring_type(ring: Keyring, as_mapping: bool) -> None:
    keys = dict(ring) if as_mapping else ring
    other = URI.replace("3mabcdefghij2", "3mabcdefghik2")
    enc = sealed(doc(parts=text_part('"text":"hi"')), ring)
    assert open_content(enc, uri=URI, keyring=keys).parts[0].text == "hi"
    flipped = enc.model_copy(update={"ciphertext": enc.ciphertext[:-1] + bytes([enc.ciphertext[-1] ^ 1])})
    with pytest.raises(DecryptError, match="key is wrong or the record was changed"):
        open_content(flipped, uri=URI, keyring=keys)
    with pytest.raises(MovedCiphertextError) as ei:
        open_content(enc, uri=other, keyring=keys, candidate_uris=[other, URI])
    assert ei.value.belongs_to == URI
    with pytest.raises(UnknownKeyError, match="'k9' is not in the keyring"):  # for a plain mapping too
        open_content(enc.model_copy(update={"key_id": "k9"}), uri=URI, keyring=keys)
    with pytest.raises(UnknownSchemeError):  # the scheme is checked before the key
        open_content(enc.model_copy(update={"scheme": "x", "key_id": "k9"}), uri=URI, keyring=keys)
    with pytest.raises(MalformedSealError, match="nonce is 12 bytes"):
        open_content(enc.model_copy(update={"nonce": bytes(12), "key_id": "k9"}), uri=URI, keyring=keys)
    with pytest.raises(MalformedSealError, match="shorter than the 16-byte tag"):
        open_content(enc.model_copy(update={"ciphertext": bytes(15)}), uri=URI, keyring=keys)
    with pytest.raises(RecordError, match="not UTF-8 JSON"):  # a tag and nothing else: empty plaintext
        open_content(sealed(b"", ring), uri=URI, keyring=keys)
