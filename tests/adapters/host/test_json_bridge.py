"""json.encode / json.decode inside the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import SandboxLimits, available_engines

SCRIPTS = Path(__file__).parent / "scripts"
_ADAPTERS: dict[str, Adapter] = {}


def identity(engine: str) -> Adapter:
    if engine not in _ADAPTERS:
        _ADAPTERS[engine] = load_adapter(
            SCRIPTS / "identity.lua", limits=SandboxLimits(engine=engine), allow_hosts={}  # type: ignore[arg-type]
        )
    return _ADAPTERS[engine]


text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(text, children, max_size=5),
    max_leaves=30,
)


def lua_view(v: object) -> object:
    """What survives null → nil: null object members vanish, trailing null array items too."""
    if isinstance(v, dict):
        return {k: lua_view(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        items = [lua_view(x) for x in v]
        while items and items[-1] is None:
            items.pop()
        return items
    return v


@pytest.mark.parametrize("engine", available_engines())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values)
def test_decode_encode_round_trip(engine: str, value: object) -> None:
    out = identity(engine).transform_request(json.dumps(value, ensure_ascii=bool(hash(str(value)) % 2)))
    assert json.loads(out) == lua_view(value)


def roundtrip(engine: str, text_in: str) -> str:
    return identity(engine).transform_request(text_in)


def test_empty_array_and_object_stay_apart(engine: str) -> None:
    src = '{"required":[],"properties":{},"nested":[[],{},[{}]]}'
    assert roundtrip(engine, src) == '{"nested":[[],{},[{}]],"properties":{},"required":[]}'


def test_integers_stay_integral(engine: str) -> None:
    assert roundtrip(engine, "[0,-1,4096,12345678901,9007199254740992]") == "[0,-1,4096,12345678901,9007199254740992]"


def test_floats(engine: str) -> None:
    out = json.loads(roundtrip(engine, "[0.1,0.7,1.5e-7,-2.25,1e300]"))
    assert out == [0.1, 0.7, 1.5e-7, -2.25, 1e300]


def test_numbers_beyond_double_range_become_null(engine: str) -> None:
    assert roundtrip(engine, '{"a":1e400,"b":-1e400,"c":1}') == '{"a":null,"b":null,"c":1}'


def test_null_member_disappears_and_array_hole_stays(engine: str) -> None:
    assert roundtrip(engine, '{"a":null,"b":[1,null,3,null]}') == '{"b":[1,null,3]}'


def test_unicode_and_escapes(engine: str) -> None:
    src = '"\\u00e9\\ud83d\\ude00 \\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u0001 ü 你好"'
    out = roundtrip(engine, src)
    assert json.loads(out) == json.loads(src)
    assert "\\u0001" in out and "é😀" in out


def test_characters_to_escape_are_found_anywhere_in_long_strings(engine: str) -> None:
    # The encoder skips plain runs 8 bytes at a time (LuaJIT): every offset, both
    # alignments of the tail, and quotes/backslashes before or after a control char.
    values = []
    for n in (7, 8, 9, 16, 17, 41):
        for i in range(n):
            for ch in ("\x01", "\x1f", '"', "\\", "\n", "é"):
                values.append("a" * i + ch + "b" * (n - i - 1))
        values.append("q" * n)
    values += ['"' + "x" * 20 + "\x02", "\x02" + "x" * 20 + '"', "\\" * 9 + "\t" * 9, "x" * 30 + '"\\"']
    out = roundtrip(engine, json.dumps(values, ensure_ascii=False))
    assert json.loads(out) == values
    assert not any(ord(c) < 32 for c in out)


def test_lone_surrogate_becomes_replacement_char(engine: str) -> None:
    assert json.loads(roundtrip(engine, '"a\\ud800b"')) == "a\ufffdb"


def test_bad_input_decodes_to_nil_with_message(make_adapter) -> None:
    a = make_adapter("local v, err = json.decode(raw) return tostring(v) .. '|' .. tostring(err)")
    for bad in ("", "{", "[1,]", "{'a':1}", "01", "nul", '"abc', "[1] x", '"\\x"', "1."):
        value, _, err = a.transform_request(bad).partition("|")
        assert value == "nil", bad
        assert err.startswith("json.decode:"), bad


def test_deep_nesting_is_bounded(make_adapter) -> None:
    a = make_adapter("local v, err = json.decode(raw) return tostring(err)")
    assert "too deep" in a.transform_request("[" * 200 + "]" * 200)
    b = make_adapter("local t = {} local c = t for i = 1, 200 do c.x = {} c = c.x end return json.encode(t)")
    with pytest.raises(Exception, match="nesting deeper"):
        b.transform_request("")


def test_encode_helpers(make_adapter) -> None:
    a = make_adapter("""
        return json.encode({
          plain_empty = {},
          arr = json.array(),
          shared = json.empty_array,
          obj = json.object({[1] = 'x'}),
          seq = {1, 2, 3},
          mixed_keys = {[1] = 'a', b = 'c'},
        })
    """)
    assert json.loads(a.transform_request("")) == {
        "plain_empty": {}, "arr": [], "shared": [], "obj": {"1": "x"}, "seq": [1, 2, 3],
        "mixed_keys": {"1": "a", "b": "c"},
    }


def test_empty_array_is_read_only(make_adapter) -> None:
    a = make_adapter("json.empty_array[1] = 5 return 'x'")
    with pytest.raises(Exception, match="read-only"):
        a.transform_request("")


def test_encode_refuses_functions_and_cycles(make_adapter) -> None:
    with pytest.raises(Exception, match="cannot encode a value of type function"):
        make_adapter("return json.encode({f = print})").transform_request("")
    with pytest.raises(Exception, match="cycle"):
        make_adapter("local t = {} t.self = t return json.encode(t)").transform_request("")


def test_decoded_array_can_be_grown_and_emptied(make_adapter) -> None:
    a = make_adapter("""
        local t = json.decode(raw)
        table.insert(t.grow, 3)
        t.shrink[1] = nil
        return json.encode(t)
    """)
    assert a.transform_request('{"grow":[1,2],"shrink":[1]}') == '{"grow":[1,2,3],"shrink":[]}'


@pytest.mark.parametrize("engine", available_engines())
def test_encode_keeps_no_text_between_calls(engine: str) -> None:
    # One adapter runtime serves every conversation: json.encode must not keep the text
    # it encoded alive after the call (no memo of plaintext between turns).
    import importlib

    from gelbridge._adapters import sandbox

    lupa = importlib.import_module({"luajit": "lupa.luajit21", "lua54": "lupa.lua54"}[engine])
    rt = lupa.LuaRuntime()
    json_lua = (Path(sandbox.__file__).with_name("lua") / "json.lua").read_text()
    out = rt.execute("local json = load(...)() " + """
        local text = string.rep("plain text ", 10)
        assert(json.encode({text}) == '["' .. text .. '"]')
        assert(json.encode({text .. "\\n"}) == '["' .. text .. '\\\\n"]')
        collectgarbage("collect")
        local before = collectgarbage("count")
        for i = 1, 2000 do json.encode({string.rep("y", 1000) .. i}) end  -- ~2 MB of distinct text
        collectgarbage("collect")
        return collectgarbage("count") - before
    """, json_lua)
    assert out < 256  # KB: nothing of the ~2 MB encoded stays reachable
