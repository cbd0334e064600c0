"""The models agree with every constraint of every lexicon file, so the two cannot drift.

For each object def (and each record's object) in ``lexicons/chat/gel/assistant``, and
for each of its properties, the test builds values at and one past every limit from
the lexicon JSON itself and checks the model accepts or rejects them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gelbridge._errors import RecordError
from gelbridge._records import MODELS_BY_TYPE, LexObject, UnknownPart

LEX_DIR = Path(__file__).resolve().parents[2] / "lexicons" / "chat" / "gel" / "assistant"
DOCS: dict[str, dict[str, Any]] = {}
for _f in sorted(LEX_DIR.glob("*.json")):
    _doc = json.loads(_f.read_text())
    DOCS[_doc["id"]] = _doc

CID = "bafyreihltcnuuyqp2jm24aqydpnlj7b6w3ogwrplomrjtg5rifv44mmjey"


def test_lexicon_files_are_lexicon_documents() -> None:
    from atproto_lexicon.parser import lexicon_parse

    assert set(DOCS) == {
        "chat.gel.assistant.defs",
        "chat.gel.assistant.message",
        "chat.gel.assistant.conversation",
        "chat.gel.assistant.settings",
        "chat.gel.assistant.bridge",
        "chat.gel.assistant.keyGrant",
    }
    keys = {}
    for nsid, doc in DOCS.items():
        assert doc["lexicon"] == 1
        lexicon_parse(doc)
        if "main" in doc["defs"]:
            keys[nsid] = doc["defs"]["main"]["key"]
    assert keys == {
        "chat.gel.assistant.message": "any",
        "chat.gel.assistant.conversation": "tid",
        "chat.gel.assistant.settings": "literal:self",
        "chat.gel.assistant.bridge": "any",
        "chat.gel.assistant.keyGrant": "tid",
    }


def test_defs_unchanged_from_the_given_spec() -> None:
    repo = Path(__file__).resolve().parents[2]
    for shared in (repo.parent / "shared", Path("/work/shared")):
        spec = shared / "spec" / "chat.gel.assistant.defs.json"
        if spec.exists():
            break
    else:
        pytest.skip("shared/spec/chat.gel.assistant.defs.json not present")
    given = json.loads(spec.read_text())
    assert DOCS["chat.gel.assistant.defs"]["defs"] == given["defs"]


# --- schema helpers -------------------------------------------------------------------


def resolve(ref: str, ctx: str) -> tuple[str, str, dict[str, Any]]:
    """(type name, lexicon id, schema) of a ref; records resolve to their object."""
    nsid, _, name = ref.partition("#")
    nsid = nsid or ctx
    name = name or "main"
    schema = DOCS[nsid]["defs"][name]
    if schema["type"] == "record":
        schema = schema["record"]
    return (nsid if name == "main" else f"{nsid}#{name}"), nsid, schema


def make_str(nbytes: int, ngraphemes: int) -> str:
    """A string of exactly ``nbytes`` UTF-8 bytes in exactly ``ngraphemes`` graphemes."""
    assert 0 < ngraphemes <= nbytes
    per, extra = divmod(nbytes, ngraphemes)
    out = []
    for i in range(ngraphemes):
        b = per + (1 if i < extra else 0)
        base = "a" if b % 2 else "\u00e9"
        out.append(base + "\u0301" * ((b - len(base.encode())) // 2))
    s = "".join(out)
    assert len(s.encode()) == nbytes
    return s


def valid(schema: dict[str, Any], ctx: str) -> Any:
    t = schema["type"]
    if t == "string":
        if "knownValues" in schema:
            return schema["knownValues"][0]
        return {"datetime": "2025-01-31T12:00:00.000Z", "uri": "https://example.com/a"}.get(
            schema.get("format", ""), "x"
        )
    if t == "integer":
        return schema.get("minimum", 0)
    if t == "boolean":
        return True
    if t == "bytes":
        return {"$bytes": base64.b64encode(b"\x01" * max(schema.get("minLength", 0),
                                                          min(24, schema.get("maxLength", 24)))).decode()}
    if t == "blob":
        return blob(schema)
    if t == "array":
        return []
    if t == "ref":
        _, nsid, target = resolve(schema["ref"], ctx)
        return valid(target, nsid)
    if t == "union":
        name, nsid, target = resolve(schema["refs"][0], ctx)
        return {"$type": name, **valid(target, nsid)}
    if t == "object":
        return {k: valid(schema["properties"][k], ctx) for k in schema.get("required", [])}
    raise AssertionError(f"unhandled lexicon type {t}")


def blob(schema: dict[str, Any], mime: str | None = None, size: int = 1) -> dict[str, Any]:
    accept = schema.get("accept", ["*/*"])
    if mime is None:
        mime = accept[0] if "*" not in accept[0] else "application/pdf"
    return {"$type": "blob", "ref": {"$link": CID}, "mimeType": mime, "size": size}


def object_defs() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for nsid, doc in DOCS.items():
        for name, schema in doc["defs"].items():
            if schema["type"] in ("object", "record"):
                yield resolve(f"{nsid}#{name}", nsid)


OBJECT_DEFS = list(object_defs())


def accepts(cls: type[LexObject], value: dict[str, Any]) -> bool:
    try:
        cls.from_value(value)
    except RecordError:
        return False
    return True


# --- the agreement ---------------------------------------------------------------------


def test_every_object_def_has_a_model_and_every_model_a_def() -> None:
    names = {name for name, _, _ in OBJECT_DEFS}
    assert names == set(MODELS_BY_TYPE)


@pytest.mark.parametrize("name,nsid,schema", OBJECT_DEFS, ids=[d[0] for d in OBJECT_DEFS])
def test_model_fields_are_the_lexicon_properties(name: str, nsid: str, schema: dict[str, Any]) -> None:
    cls = MODELS_BY_TYPE[name]
    aliases = {(f.alias or n) for n, f in cls.model_fields.items()} - {"$type"}
    assert aliases == set(schema["properties"])
    for prop, p in schema["properties"].items():
        if "default" in p:
            field = next(f for n, f in cls.model_fields.items() if (f.alias or n) == prop)
            assert field.default == p["default"], prop


@pytest.mark.parametrize("name,nsid,schema", OBJECT_DEFS, ids=[d[0] for d in OBJECT_DEFS])
def test_model_enforces_every_property_constraint(name: str, nsid: str, schema: dict[str, Any]) -> None:
    cls = MODELS_BY_TYPE[name]
    base = valid(schema, nsid)
    if "#" not in name:  # records carry their $type
        base["$type"] = name
    assert accepts(cls, base), f"{name}: minimal valid value rejected"
    wrong_type = {k: v for k, v in base.items()}
    if "#" not in name:
        wrong_type["$type"] = "com.example.other"
        assert not accepts(cls, wrong_type)

    for prop, p in schema["properties"].items():
        ctx = f"{name}.{prop}"

        def ok(v: Any) -> bool:
            return accepts(cls, {**base, prop: v})

        # required-ness
        without = {k: v for k, v in base.items() if k != prop}
        assert accepts(cls, without) == (prop not in schema.get("required", [])), ctx
        check_property(p, nsid, ok, ctx, cls)


def check_property(p: dict[str, Any], nsid: str, ok: Any, ctx: str, cls: type[LexObject]) -> None:
    t = p["type"]
    if t == "ref":
        _, tnsid, target = resolve(p["ref"], nsid)
        if target["type"] == "object":
            assert ok(valid(target, tnsid)), ctx
            assert not ok("not an object"), ctx
            if target.get("required"):
                assert not ok({}), ctx
            return
        check_property(target, tnsid, ok, ctx, cls)
        return
    assert ok(valid(p, nsid)), ctx
    if t == "string":
        assert not ok(12345), ctx
        assert not ok(b"bytes"), ctx
        max_b, max_g = p.get("maxLength"), p.get("maxGraphemes")
        if max_b is not None:
            g = min(max_g or max_b, max_b)
            assert ok(make_str(max_b, g)), f"{ctx}: {max_b} bytes"
            assert not ok(make_str(max_b + 1, min(g, max_b + 1))), f"{ctx}: {max_b}+1 bytes"
            # the unit is UTF-8 bytes, not code points
            over = make_str(max_b + 1, min(g, (max_b + 1) // 2))
            assert len(over) <= max_b and not ok(over), f"{ctx}: counts bytes"
        if max_g is not None:
            many_cp = make_str(min(max_b or 10 * max_g, 10 * max_g), max_g)
            assert len(many_cp) > max_g and ok(many_cp), f"{ctx}: {max_g} graphemes"
            assert not ok("a" * (max_g + 1)), f"{ctx}: {max_g}+1 graphemes"
        for known in p.get("knownValues", []):
            assert ok(known), ctx
        if "knownValues" in p:
            assert ok("someValueNotKnownYet"), f"{ctx}: knownValues are open"
        if p.get("format") == "datetime":
            assert ok("2025-01-31T12:00:00Z") and ok("2025-01-31T12:00:00.123456+02:00"), ctx
            for bad in ("yesterday", "2025-01-31", "2025-01-31T12:00:00", "2025-02-30T12:00:00Z"):
                assert not ok(bad), f"{ctx}: {bad}"
        if p.get("format") == "uri":
            assert ok("at://did:plc:abc/x.y.z/1") and not ok("no scheme here"), ctx
    elif t == "integer":
        assert not ok("5") and not ok(True) and not ok(1.5), ctx
        if "minimum" in p:
            assert ok(p["minimum"]) and not ok(p["minimum"] - 1), ctx
        if "maximum" in p:
            assert ok(p["maximum"]) and not ok(p["maximum"] + 1), ctx
    elif t == "boolean":
        assert ok(True) and ok(False) and not ok("true") and not ok(1), ctx
    elif t == "bytes":
        n = p["maxLength"]
        assert ok({"$bytes": base64.b64encode(b"\x07" * n).decode()}), ctx
        assert ok(b"\x07" * n), f"{ctx}: CBOR form"
        assert not ok({"$bytes": base64.b64encode(b"\x07" * (n + 1)).decode()}), ctx
        assert not ok(b"\x07" * (n + 1)), ctx
        assert not ok("not bytes") and not ok({"$bytes": "!!"}), ctx
        if p.get("minLength"):
            m = p["minLength"]
            assert ok(b"\x07" * m) and not ok(b"\x07" * (m - 1)), f"{ctx}: minLength"
    elif t == "blob":
        accept = p.get("accept", ["*/*"])
        for mime in accept:
            assert ok(blob(p, mime if "*" not in mime else "application/zip")), ctx
        if "*/*" not in accept:
            assert not ok(blob(p, "application/x-not-accepted")), ctx
        if "maxSize" in p:
            assert ok(blob(p, size=p["maxSize"])) and not ok(blob(p, size=p["maxSize"] + 1)), ctx
        assert not ok({"cid": CID, "mimeType": "image/png"}), f"{ctx}: legacy blob"
        assert not ok({**blob(p), "ref": {"$link": "not-a-cid"}}), ctx
    elif t == "array":
        n = p["maxLength"]
        item = valid(p["items"], nsid)
        assert ok([item] * n), ctx
        assert not ok([item] * (n + 1)), ctx
        assert not ok(item if not isinstance(item, list) else "x"), ctx
        items = p["items"]
        if items["type"] == "string" and "maxLength" in items:
            assert not ok([make_str(items["maxLength"] + 1, 1)]), f"{ctx}: item maxLength"
        if items["type"] == "union":
            check_union(items, nsid, lambda v: ok([v]), ctx, cls, in_array=True)
    elif t == "union":
        check_union(p, nsid, ok, ctx, cls, in_array=False)


def check_union(p: dict[str, Any], nsid: str, ok: Any, ctx: str, cls: type[LexObject], *, in_array: bool) -> None:
    for ref in p["refs"]:
        name, tnsid, target = resolve(ref, nsid)
        member = {"$type": name, **valid(target, tnsid)}
        assert ok(member), f"{ctx}: member {name}"
        without_type = {k: v for k, v in member.items() if k != "$type"}
        assert not ok(without_type), f"{ctx}: member without $type"
        assert not ok({"$type": name}) or not target.get("required"), f"{ctx}: empty {name}"
    unknown = {"$type": "com.example.future#part", "anything": [1, {"nested": True}]}
    if in_array:
        # open union: unknown parts are kept, not rejected
        assert ok(unknown), f"{ctx}: unknown member kept"
    else:
        assert not ok(unknown), f"{ctx}: unknown content member rejected"


def test_unknown_parts_round_trip_unchanged() -> None:
    from gelbridge._records import PlainContent

    unknown = {"$type": "com.example.future#part", "anything": [1, {"nested": True}], "b": {"$bytes": "AQID"}}
    pc = PlainContent.from_value({"parts": [unknown]})
    assert isinstance(pc.parts[0], UnknownPart)
    assert pc.to_value()["parts"] == [unknown]


def test_reply_statuses_are_the_lexicons_known_values() -> None:
    from gelbridge._records.constants import FINAL_STATUSES, ReplyStatus

    status = DOCS["chat.gel.assistant.message"]["defs"]["main"]["record"]["properties"]["status"]
    assert [s.value for s in ReplyStatus] == status["knownValues"]
    assert FINAL_STATUSES == set(ReplyStatus) - {ReplyStatus.PENDING, ReplyStatus.STREAMING}
