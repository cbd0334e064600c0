"""``luxkit``, the host's helper library: usable by any script, never writable, no way out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gelbridge._adapters import sandbox
from gelbridge._errors import AdapterError, AdapterLoadError, SandboxViolation

LUXKIT = Path(sandbox.__file__).with_name("lua") / "luxkit.lua"


def exports() -> list[str]:
    text = LUXKIT.read_text()
    return re.findall(r"(\w+) = \1\b", text[text.rindex("\nreturn {"):])


def test_script_can_use_luxkit_helpers(make_adapter) -> None:
    a = make_adapter("""
        return json.encode({
          kind = luxkit.error_kind(nil, "rate_limit_error", 500),
          args = luxkit.args_string({ a = 1 }),
          none = luxkit.args_string(""),
          id = luxkit.safe_id("call/1 x"),
          text = luxkit.text_of({ { type = "text", text = "a" }, { type = "image" }, { type = "text", text = "b" } }, "+"),
          skip = luxkit.emit({}),
          delta = luxkit.emit({ { event = "block_delta", index = 2, delta = { type = "text", text = 'say "hi"' } } }),
          err = luxkit.error_response(luxkit.lux_error("invalid_request", "bad", 400)),
          tools = luxkit.function_tools({ { name = "a" }, { kind = "web_search" }, { name = "b", parameters = {} },
            { name = "skip" } }, function(t, p) if t.name ~= "skip" then return { t.name, p } end end),
          no_tools = luxkit.function_tools(nil, print),
        })
    """)
    out = json.loads(a.transform_request(""))
    assert out["kind"] == "rate_limit" and out["args"] == '{"a":1}' and out["none"] == "{}"
    assert out["id"] == "call_1_x" and out["text"] == "a+b" and out["skip"] == ""
    assert json.loads(out["delta"]) == {"event": "block_delta", "index": 2, "delta": {"type": "text", "text": 'say "hi"'}}
    assert out["tools"] == [["a", {"type": "object", "properties": {}}], ["b", {}]] and out["no_tools"] == []
    err = json.loads(out["err"])
    assert err["choices"][0]["finish_reason"] == "error"
    assert err["error"] == {"kind": "invalid_request", "message": "bad", "provider_code": "400"}


def test_user_script_can_be_an_openai_family_adapter(make_adapter) -> None:
    a = make_adapter(
        "return family.transform_request(raw)",
        extra='local family = luxkit.openai_family("openai")\n',
    )
    req = {"model": "gpt-4o", "instructions": [{"type": "text", "text": "be brief"}],
           "conversation": [{"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": "hi"}]}}]}
    body = json.loads(a.transform_request(json.dumps(req)))
    assert body == {"model": "gpt-4o", "messages": [{"role": "system", "content": "be brief"},
                                                    {"role": "user", "content": "hi"}]}


def test_openai_family_refuses_an_unknown_flavor_at_the_script_line(make_adapter) -> None:
    with pytest.raises(AdapterLoadError, match=r'^t_1\.lua:2: luxkit\.openai_family: flavor must be "openai", '
                                                r'"deepseek" or "openrouter", got mistral'):
        make_adapter("return ''", extra='local family = luxkit.openai_family("mistral")\n')


WRITES = {
    "assign existing": "luxkit.emit = print",
    "assign new": "luxkit.extra = 1",
    "rawset": "rawset(luxkit, 'emit', print)",
    "setmetatable": "setmetatable(luxkit, {})",
    "table.insert": "table.insert(luxkit, print)",
    "table.move": "table.move({ print }, 1, 1, 1, luxkit)",
}


@pytest.mark.parametrize("code", WRITES.values(), ids=WRITES.keys())
def test_luxkit_cannot_be_modified(make_adapter, code: str) -> None:
    a = make_adapter(f"""
        local emit = luxkit.emit
        local ok, err = pcall(function() {code} end)
        local intact = luxkit.emit == emit and luxkit.extra == nil and rawget(luxkit, "emit") == nil
          and rawget(luxkit, 1) == nil and next(luxkit) == nil and getmetatable(luxkit) == "luxkit"
        return tostring(ok) .. "|" .. tostring(intact) .. "|" .. tostring(err)
    """)
    ok, intact, err = a.transform_request("").split("|", 2)
    assert (ok, intact) == ("false", "true")
    assert "read-only" in err or "protected metatable" in err


def test_luxkit_hands_out_neither_its_table_nor_a_library_function(make_adapter, engine: str) -> None:
    names = exports()
    a = make_adapter("""
        local known = {}
        for _, lib in ipairs({ _G, string, table, math, os, coroutine, utf8 or {}, json }) do
          for _, v in pairs(lib) do known[v] = true end
        end
        local out = { kinds = json.object(), known = json.array(), listed = json.array() }
        for _, n in ipairs(json.decode(raw)) do
          out.kinds[n] = type(luxkit[n])
          if known[luxkit[n]] then out.known[#out.known + 1] = n end
        end
        local iter, state = pairs(luxkit) -- Lua 5.4 honours __pairs; LuaJIT lists nothing
        for k in iter, state do out.listed[#out.listed + 1] = k end
        out.state_is_proxy = state == luxkit or state == nil
        return json.encode(out)
    """)
    out = json.loads(a.transform_request(json.dumps(names)))
    assert out["kinds"] == {n: "function" for n in names}
    assert out["known"] == [] and out["state_is_proxy"] is True
    assert sorted(out["listed"]) == (sorted(names) if engine == "lua54" else [])


def test_family_tables_are_the_scripts_own(make_adapter) -> None:
    # openai_family returns a fresh plain table: a script may wrap its functions,
    # and doing so changes nothing for another caller.
    a = make_adapter("""
        local f1 = luxkit.openai_family("openai")
        f1.transform_request = nil
        local f2 = luxkit.openai_family("openai")
        return type(f2.transform_request) .. tostring(f1 ~= f2)
    """)
    assert a.transform_request("") == "functiontrue"


def test_replacing_json_in_a_script_does_not_change_luxkit(make_adapter) -> None:
    a = make_adapter("""
        json.encode = function() return "forged" end
        return luxkit.args_string({ a = 1 })
    """)
    assert a.transform_request("") == '{"a":1}'


def test_errors_inside_luxkit_name_the_calling_script_line(make_adapter) -> None:
    a = make_adapter("local s = luxkit.text_of({ 5 })\nreturn s")
    with pytest.raises(AdapterError, match=r"t_1\.lua:3: luxkit:\d+: attempt to index"):
        a.transform_request("")


def test_pattern_guard_holds_inside_luxkit(make_adapter) -> None:
    # openai_family matches the model name with "([^/]*)$": quadratic on "aaa...a/".
    # luxkit uses the sandbox's guarded string functions, so the cost is refused up
    # front; with the raw ones this would spin in C (~1 s here, unbounded for longer).
    a = make_adapter(
        "return family.transform_request(raw)",
        extra='local family = luxkit.openai_family("openai")\n',
    )
    req = {"model": "a" * 20000 + "/", "conversation": [], "options": {"max_output_tokens": 5}}
    with pytest.raises(SandboxViolation) as info:
        a.transform_request(json.dumps(req))
    assert info.value.limit == "pattern"


def test_instruction_limit_holds_inside_luxkit(make_adapter, engine: str) -> None:
    # LuaJIT runs compiled loops without firing the instruction hook, so luxkit, like
    # script code, runs with the JIT off. The list comes from json.decode (host code,
    # compiled: ~25k instructions counted for a million items), so the control fits
    # the budget; walking it in luxkit.text_of (~3M instructions) must not.
    if engine == "lua54":
        pytest.skip("Lua 5.4 has no JIT: every function, luxkit's included, is counted")
    build = "local blocks = json.decode('[' .. string.rep('false,', 1000000) .. 'false]')\n"
    control = make_adapter(build + "return tostring(#blocks)", max_instructions=1_000_000)
    assert control.transform_request("") == "1000001"
    walked = make_adapter(build + "return luxkit.text_of(blocks)", max_instructions=1_000_000)
    with pytest.raises(SandboxViolation) as info:
        walked.transform_request("")
    assert info.value.limit == "instructions"
