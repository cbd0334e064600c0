"""Every entry point fed generated hostile input answers with a result or one clear
error: never a traceback, in bounded time and memory.

Entry points: the CLI's ``open`` and ``convert`` (run through ``gelbridge._cli.main`` with
a strict UTF-8 stdout, as a terminal or pipe has), the record models, the CAR reader,
the firehose frame decoder, the Jetstream decoder and the keyring loader. Inputs: JSON
and CBOR nested far past every limit, lone surrogates (escaped in JSON, which Python
decodes into ``str``), byte soup, and valid records and files with mutated fields.

Budget: ``FUZZ_EXAMPLES`` examples per test (``GELBRIDGE_FUZZ_EXAMPLES``, default 60),
each under ``DEADLINE_MS`` and ``PEAK_BYTES``; the whole module runs in well under a
minute. The examples are the same on every run (CI must not flake);
``GELBRIDGE_FUZZ_RANDOM=1`` draws new ones (a longer local hunt: 300 examples took
~90 s here).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gelbridge._cli import main as cli_main
from gelbridge._errors import GelbridgeError
from gelbridge._firehose import decode_frame_full
from gelbridge._ingest import RecordFilter, from_firehose_frame, from_jetstream_event
from gelbridge._records import ConversationRecord, MessageRecord
from gelbridge._records.io import records_from_car, records_from_json
from gelbridge._records.nesting import MAX_DEPTH, loads
from gelbridge._sealing import Keyring, open_record

FUZZ_EXAMPLES = int(os.environ.get("GELBRIDGE_FUZZ_EXAMPLES", "60"))
DEADLINE_MS = 5000
PEAK_BYTES = 256 * 1024 * 1024
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"
MSG = "chat.gel.assistant.message"
DID = "did:plc:fuzz0000000000000000000"
FILTER = RecordFilter.for_dids([DID])

with contextlib.suppress(GelbridgeError):  # imports the SDK's frame types now: under tracemalloc it takes seconds
    decode_frame_full(b"", None)

fuzz = settings(max_examples=FUZZ_EXAMPLES, deadline=DEADLINE_MS, derandomize=os.environ.get("GELBRIDGE_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def bounded_memory() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < PEAK_BYTES, f"peak memory {peak} bytes"
    finally:
        tracemalloc.stop()


def clean(call: Callable[[], Any], *errors: type[BaseException]) -> Any:
    """``call()`` returns, or raises one of ``errors`` (all GelbridgeError by default)."""
    caught = errors or (GelbridgeError,)
    with bounded_memory():
        try:
            return call()
        except caught as e:
            assert str(e) and "\n" not in str(e), repr(e)
            return e


# --- generators ------------------------------------------------------------------------------------

_chars = st.characters(codec=None, exclude_categories=())  # surrogates included
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(_chars, max_size=30))
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(st.text(_chars, max_size=8), kids,
                                                                          max_size=4)), max_leaves=30)


LEVELS = [MAX_DEPTH, MAX_DEPTH + 1, 300, 999, 1100]  # Python values: as deep as a decoder can give
TEXT_LEVELS = [*LEVELS, 5000, 50_000]  # texts and bytes: as deep as anyone can send


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """A value nested ``levels`` deep (lists and objects mixed), past every limit."""
    levels = draw(st.sampled_from(LEVELS))
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=8))
    value: Any = draw(scalars)
    for i in range(levels):
        value = [value] if kinds[i % len(kinds)] else {"k": value}
    return value


@st.composite
def deep_json_text(draw: st.DrawFn) -> str:
    """JSON text nested up to 50,000 levels (built as text: no encoder recursion)."""
    levels = draw(st.sampled_from(TEXT_LEVELS))
    obj = draw(st.booleans())
    return ('{"k":' * levels if obj else "[" * levels) + "1" + ("}" * levels if obj else "]" * levels)


@st.composite
def deep_cbor(draw: st.DrawFn) -> bytes:
    """CBOR nested up to 50,000 levels (arrays of one, or maps of one key)."""
    levels = draw(st.sampled_from(TEXT_LEVELS))
    return (b"\x81" if draw(st.booleans()) else b"\xa1\x61k") * levels + b"\x01"


@contextlib.contextmanager
def recursion(limit: int) -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def json_text(value: Any) -> str:
    with recursion(10_000):  # test-side encoding of values up to 1,100 levels
        return json.dumps(value)  # escapes lone surrogates as \\udXXX: valid JSON text


def cbor(value: Any) -> bytes:
    """DAG-CBOR of ``value`` built by hand, iteratively (any depth: libipld's encoder and
    a recursive one both have limits)."""
    out: list[bytes] = []
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, bytes):  # an already encoded piece
            out.append(v)
        elif v is None:
            out.append(b"\xf6")
        elif v is True or v is False:
            out.append(b"\xf5" if v else b"\xf4")
        elif isinstance(v, int):
            out.append(_head(0, v) if v >= 0 else _head(1, -1 - v))
        elif isinstance(v, str):
            raw = v.encode("utf-8", "surrogatepass")  # invalid UTF-8 for a lone surrogate
            out.append(_head(3, len(raw)) + raw)
        elif isinstance(v, list):
            out.append(_head(4, len(v)))
            stack.extend(reversed(v))
        else:
            items = sorted(v.items(), key=lambda kv: (len(kv[0]), kv[0]))
            out.append(_head(5, len(items)))
            for k, x in reversed(items):
                stack.append(x)
                stack.append(_text(k))
    return b"".join(out)


def _text(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    return _head(3, len(raw)) + raw


def _head(major: int, n: int) -> bytes:
    n = min(n, 2**64 - 1)
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
    raise AssertionError


def valid_message() -> dict[str, Any]:
    doc = json.loads((EXAMPLE / "records.json").read_text())
    return next(r["value"] for r in doc["records"] if r["value"].get("role") == "user")


@st.composite
def mutated_message(draw: st.DrawFn) -> dict[str, Any]:
    """A real user message with one field replaced by something hostile."""
    value = valid_message()
    where = draw(st.sampled_from(["conversation", "role", "parent", "content", "generation", "createdAt",
                                  "extra", "model", "usage"]))
    value[where] = draw(st.one_of(json_values, deep()))
    return value


hostile_values = st.one_of(json_values, deep(), mutated_message())


# --- the record models ---------------------------------------------------------------------------


@fuzz
@given(hostile_values)
def test_record_models_take_any_value_and_answer_with_a_record_or_a_record_error(value: Any) -> None:
    for model in (MessageRecord, ConversationRecord):
        clean(lambda: model.from_value(value, uri=f"at://{DID}/{MSG}/k"))


@fuzz
@given(hostile_values)
def test_open_record_returns_an_error_never_raises(value: Any) -> None:
    from gelbridge._records import AtUri

    ring = Keyring.load(EXAMPLE / "keyring.json")
    r = clean(lambda: open_record(AtUri(DID, MSG, "3mbd36vbls22b"), None, value, keyring=ring))
    assert not isinstance(r, BaseException)  # errors are returned in the OpenedRecord


# --- decoders ------------------------------------------------------------------------------------------


@fuzz
@given(st.one_of(hostile_values.map(json_text), deep_json_text(), st.text(_chars, max_size=200)))
def test_json_from_outside_decodes_or_is_a_value_error(text: str) -> None:
    got = clean(lambda: loads(text), ValueError)
    assert not isinstance(got, RecursionError)


@fuzz
@given(st.one_of(hostile_values.map(json_text), deep_json_text(), st.binary(max_size=300)))
def test_the_jetstream_decoder_answers_with_records_or_one_record_error(record: str | bytes) -> None:
    if isinstance(record, bytes):
        clean(lambda: from_jetstream_event(record + MSG.encode(), FILTER))
        return
    event = ('{"did": "%s", "time_us": 1, "kind": "commit", "commit": {"rev": "r", "operation": "create", '
             '"collection": "%s", "rkey": "3mk", "cid": "bafy", "record": %s}}') % (DID, MSG, record)
    for got in (clean(lambda: from_jetstream_event(event, FILTER)),
                clean(lambda: from_jetstream_event(event.encode("utf-8", "surrogatepass"), FILTER))):
        if isinstance(got, list):  # what passes on goes to the record models: they answer too
            for r in got:
                clean(lambda: MessageRecord.from_value(r.record, uri="at://x/y/z"))


#: Text gelbridge cannot keep (gelbridge._records.text) and text it can, next to record keys.
HOSTILE_TEXT = ["\ud800", "3mk\udfff2", "\x00", "3mk\x002", "\ufffe", "3mk\uffff", "\x1b[2J", "3mk2\n"]
keys = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(_chars, max_size=20), st.just("3mkvalidkey22"))


def _kept(rec: Any) -> None:
    """What a decoder passes on has a record key and a CID (or None) gelbridge can store."""
    from gelbridge._records.keys import is_valid_rkey
    from gelbridge._records.text import is_storable

    assert is_valid_rkey(rec.rkey), ascii(rec.rkey)
    assert rec.cid is None or (is_storable(rec.cid) and rec.cid.isascii()), ascii(rec.cid)


@fuzz
@given(keys, keys, st.sampled_from(["create", "update", "delete"]))
def test_jetstream_events_with_hostile_keys_and_cids_never_pass_them_on(rkey: str, cid: str, op: str) -> None:
    event = {"did": DID, "time_us": 1, "kind": "commit", "commit": {
        "rev": "r", "operation": op, "collection": MSG, "rkey": rkey, "cid": cid, "record": valid_message()}}
    text = json.dumps(event)  # escapes lone surrogates: valid JSON
    for given_ in (event, text, text.encode()):
        got = clean(lambda: from_jetstream_event(given_, FILTER))
        for rec in got if isinstance(got, list) else []:
            _kept(rec)


@fuzz
@given(keys)
def test_firehose_ops_with_hostile_record_keys_are_skipped(rkey: str) -> None:
    frame = _commit_frame([("create", f"{MSG}/{rkey}"), ("create", f"{MSG}/3mkvalidkey22")])
    got = clean(lambda: from_firehose_frame(frame, FILTER))
    if isinstance(got, list):
        for rec in got:
            _kept(rec)
        assert "3mkvalidkey22" in [r.rkey for r in got]  # one bad op never costs the others


def _commit_frame(ops: list[tuple[str, str]]) -> bytes:
    """A commit frame of ``ops`` (action, path), each with the valid message as its block
    (paths as CBOR text, lone surrogates as the invalid UTF-8 a hostile relay could send)."""
    block = cbor(valid_message())
    cid = bytes.fromhex("01711220") + hashlib.sha256(block).digest()
    car = _car_header([cid]) + _varint(len(cid) + len(block)) + cid + block
    body = {"seq": 5, "repo": DID, "rev": "r", "since": None, "time": "2026-01-01T00:00:00Z",
            "ops": [{"action": a, "path": p, "cid": _link(cid)} for a, p in ops], "commit": None,
            "rebase": False, "tooBig": False, "blobs": []}
    return cbor({"op": 1, "t": "#commit"}) + _cbor_with_bytes(body, car)


@fuzz
@given(st.one_of(hostile_values.map(cbor), deep_cbor(), st.binary(max_size=300)))
def test_the_firehose_decoder_answers_with_events_or_one_firehose_error(block: bytes) -> None:
    """A commit whose record block is hostile CBOR, and frames that are byte soup."""
    car = _car_header() + _varint(len(_CID) + len(block)) + _CID + block
    body = {"seq": 5, "repo": DID, "rev": "r", "since": None, "time": "2026-01-01T00:00:00Z",
            "ops": [{"action": "create", "path": f"{MSG}/3mk", "cid": None}], "commit": None,
            "rebase": False, "tooBig": False, "blobs": []}
    header = cbor({"op": 1, "t": "#commit"})
    frames = [header + _cbor_with_bytes(body, car), block, header + block + MSG.encode(),
              header + _cbor_with_bytes(body, block)]
    for frame in frames:
        clean(lambda: decode_frame_full(frame, {DID}))
        clean(lambda: from_firehose_frame(frame, FILTER))


_CID = bytes.fromhex("01711220") + bytes(32)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _car_header(roots: list[bytes] | None = None) -> bytes:
    header = _cbor_with_roots(_head(4, len(roots or [])) + b"".join(_link(r) for r in roots or []))
    return _varint(len(header)) + header


def _cbor_with_bytes(body: dict[str, Any], blocks: bytes) -> bytes:
    """``body`` plus ``blocks`` as a CBOR byte string (our encoder writes only text)."""
    items = sorted([*body.items(), ("blocks", None)], key=lambda kv: (len(kv[0]), kv[0]))
    out = _head(5, len(items))
    for k, v in items:
        out += cbor(k) + (_head(2, len(blocks)) + blocks if k == "blocks" else cbor(v))
    return out


# --- files: CAR, records JSON, keyring, and the CLI on them --------------------------------------------


@fuzz
@given(st.one_of(st.binary(max_size=400), hostile_values.map(cbor), deep_cbor()),
       st.sampled_from(["soup", "root", "block"]))
def test_the_car_reader_answers_with_records_or_one_record_error(data: bytes, where: str) -> None:
    """Byte soup, a header whose roots are not CIDs, a hostile block under a valid header."""
    if where == "root":
        header = _cbor_with_roots(data)
        data = _varint(len(header)) + header
    elif where == "block":
        data = _car_header([_CID]) + _varint(len(_CID) + len(data)) + _CID + data
    clean(lambda: records_from_car(data))


def _cbor_with_roots(roots: bytes) -> bytes:
    """A CAR header ``{"roots": <roots>, "version": 1}`` with ``roots`` as given (raw CBOR)."""
    return _head(5, 2) + cbor("roots") + roots + cbor("version") + cbor(1)


def _link(cid: bytes) -> bytes:
    return b"\xd8\x2a" + _head(2, len(cid) + 1) + b"\x00" + cid  # tag 42: a CID


@fuzz
@given(hostile_values)
def test_a_records_document_of_any_shape_is_entries_or_one_record_error(value: Any) -> None:
    clean(lambda: records_from_json(value))
    clean(lambda: records_from_json({"records": [{"uri": f"at://{DID}/{MSG}/3mk", "value": value}]}))


def run_cli(*args: str) -> tuple[int, str, str]:
    """``gelbridge ARGS`` in-process with strict UTF-8 stdout/stderr (as a pipe has)."""
    out, err = io.BytesIO(), io.BytesIO()
    o = io.TextIOWrapper(out, encoding="utf-8", errors="strict")
    e = io.TextIOWrapper(err, encoding="utf-8", errors="strict")
    argv = sys.argv
    sys.argv = ["gelbridge", *args]
    code: Any = 0
    try:
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            try:
                cli_main()
            except SystemExit as x:
                code = x.code
            o.flush()
            e.flush()
    finally:
        sys.argv = argv
    return int(code or 0), out.getvalue().decode(), err.getvalue().decode()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-cli")
    (d / "keyring.json").write_bytes((EXAMPLE / "keyring.json").read_bytes())
    return d


@fuzz
@given(st.one_of(mutated_message().map(json_text), deep().map(json_text), json_values.map(json_text),
                 deep_json_text()), st.sampled_from([0, 3]))
def test_cli_open_and_convert_print_json_or_one_error_line(workdir: Path, value: str, index: int) -> None:
    """One record of the example replaced: the conversation record (0) or the message
    answered (3)."""
    records = workdir / "records.json"
    doc = json.loads((EXAMPLE / "records.json").read_text())
    doc["records"][index]["value"] = "@VALUE@"
    records.write_bytes(json.dumps(doc).replace('"@VALUE@"', value).encode("utf-8", "surrogatepass"))
    first = doc["records"][0]["uri"].rsplit("/", 1)[1]
    for args in (["open", "--keyring", str(workdir / "keyring.json"), str(records)],
                 ["convert", "--keyring", str(workdir / "keyring.json"), "--message", first, str(records)],
                 ["convert", "--keyring", str(workdir / "keyring.json"), "--message", ANSWERED, str(records)]):
        check_cli(*args)


ANSWERED = "3mbd36vbls22b"  # the example's last user message


def check_cli(*args: str) -> tuple[int, str, str]:
    """``gelbridge ARGS`` ends with JSON or one error line: exit 0 or 1, never a traceback."""
    with bounded_memory():
        code, out, err = run_cli(*args)
    assert code in (0, 1), (args, code, err[-500:])
    assert "Traceback" not in err, err[-2000:]
    if code == 1:
        assert err.count("\n") <= 100 and err.rstrip().splitlines()[-1].startswith("error: "), err[-500:]
    return code, out, err


def _set(path: str, text: str) -> Callable[[dict[str, Any]], None]:
    """Set a field of the answered message (``a.b`` nested, ``a[0]`` in a list) to ``text``."""
    def apply(value: dict[str, Any]) -> None:
        *outer, last = path.split(".")
        for name in outer:
            value = value.setdefault(name, {})
        if last.endswith("[0]"):
            value[last[:-3]] = [text]
        elif last == "@name":
            value[text] = "x"
        else:
            value[last] = text
    return apply


TEXT_FIELDS = ["conversation", "parent", "role", "effort", "createdAt", "generation.effort",
               "generation.model.provider", "generation.model.id", "generation.tools[0]", "content.keyId",
               "content.scheme", "extra.deep", "@name"]


@pytest.mark.parametrize("text", HOSTILE_TEXT, ids=ascii)
@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_cli_on_hostile_text_in_any_field_of_the_answered_message(workdir: Path, field: str, text: str) -> None:
    """Each field of the message ``convert`` answers set to text gelbridge cannot keep (a
    lone surrogate, NUL) or can (U+FFFE, controls): JSON or one error line, and text it
    cannot keep is refused as such (naming the field, never the text)."""
    from gelbridge._records.text import text_problem

    doc = json.loads((EXAMPLE / "records.json").read_text())
    _set(field, text)(doc["records"][3]["value"])
    records = workdir / "records.json"
    records.write_bytes(json.dumps(doc).encode())  # JSON escapes: \\ud800, \\u0000
    check_cli("open", "--keyring", str(workdir / "keyring.json"), str(records))
    code, out, err = check_cli("convert", "--keyring", str(workdir / "keyring.json"), "--message", ANSWERED,
                               str(records))
    if text_problem(text) is not None:
        assert code == 1 and ("surrogate" in err or "NUL" in err), err[-500:]
        assert text not in err and ascii(text)[1:-1] not in err.split("field", 1)[-1]


@fuzz
@given(st.one_of(hostile_values.map(json_text), deep_json_text(),
                 st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_the_keyring_loader_answers_with_a_keyring_or_one_keyring_error(workdir: Path, text: str) -> None:
    path = workdir / "ring.json"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    clean(lambda: Keyring.load(path))
    code, _, err = run_cli("open", "--keyring", str(path), str(EXAMPLE / "records.json"))
    assert code in (0, 1) and "Traceback" not in err, err[-2000:]
