"""Every way out of the sandbox that we know of is closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gelbridge._adapters.host import load_adapter
from gelbridge._adapters.sandbox import LuaSandbox, SandboxLimits
from gelbridge._adapters.script_services import AdapterServices
from gelbridge._errors import AdapterError, AdapterLoadError

FORBIDDEN_GLOBALS = [
    "python", "io", "package", "require", "load", "loadstring", "dofile", "loadfile",
    "debug", "jit", "getfenv", "setfenv", "newproxy", "gcinfo", "module", "warn",
]


@pytest.mark.parametrize("name", FORBIDDEN_GLOBALS)
def test_forbidden_global_is_absent(make_adapter, name: str) -> None:
    a = make_adapter(f"return type(rawget(_G, {name!r}))")
    assert a.transform_request("") == "nil"


def test_os_has_only_time_clock_date(make_adapter) -> None:
    a = make_adapter("local k = {} for n in pairs(os) do k[#k+1] = n end table.sort(k) return table.concat(k, ',')")
    assert a.transform_request("") == "clock,date,time"


def test_string_dump_is_absent(make_adapter) -> None:
    assert make_adapter("return type(string.dump)").transform_request("") == "nil"


def test_python_eval_and_builtins_unreachable(make_adapter) -> None:
    a = make_adapter("return python.eval('1+1')")
    with pytest.raises(AdapterError, match="attempt to index"):
        a.transform_request("")
    b = make_adapter("return python.builtins.__import__('os').getcwd()")
    with pytest.raises(AdapterError, match="attempt to index"):
        b.transform_request("")


def test_walk_from_globals_finds_no_userdata_or_loader(make_adapter) -> None:
    # Visits every table reachable from _G and from metatables; a Python object
    # (userdata) or a leftover loader anywhere would show up here.
    a = make_adapter("""
        local seen, bad = {}, {}
        local function walk(v, path, depth)
          if depth > 8 then return end
          local t = type(v)
          if t == "userdata" or t == "thread" then bad[#bad+1] = path .. ":" .. t end
          if t == "string" then
            local mt = getmetatable(v)
            if mt then bad[#bad+1] = "string metatable reachable" end
          end
          if t ~= "table" or seen[v] then return end
          seen[v] = true
          local mt = getmetatable(v)
          if type(mt) == "table" then walk(mt, path .. "<mt>", depth + 1) end
          for k, x in pairs(v) do
            if k == "load" or k == "loadstring" or k == "dump" or k == "dofile" then
              bad[#bad+1] = path .. "." .. tostring(k)
            end
            walk(x, path .. "." .. tostring(k), depth + 1)
          end
        end
        walk(_G, "_G", 0)
        walk("", "string", 0)
        return table.concat(bad, " ")
    """)
    assert a.transform_request("") == ""


def test_string_metatable_is_protected(make_adapter) -> None:
    assert make_adapter("return tostring(getmetatable(''))").transform_request("") == "false"
    a = make_adapter("return getmetatable('').__index")
    with pytest.raises(AdapterError, match="attempt to index"):
        a.transform_request("")


def test_collectgarbage_is_reduced_to_count(make_adapter) -> None:
    assert make_adapter("return type(collectgarbage('count'))").transform_request("") == "number"
    for opt in ("", "'collect'", "'stop'", "'step'"):
        with pytest.raises(AdapterError, match="not available"):
            make_adapter(f"collectgarbage({opt}) return 'x'").transform_request("")


def test_gc_metamethods_refused(make_adapter) -> None:
    a = make_adapter("setmetatable({}, {__gc = function() end}) return 'x'")
    with pytest.raises(AdapterError, match="__gc"):
        a.transform_request("")


def test_binary_chunk_refused(tmp_path: Path, engine: str) -> None:
    import importlib

    mod = importlib.import_module({"luajit": "lupa.luajit21", "lua54": "lupa.lua54"}[engine])
    rt = mod.LuaRuntime(encoding=None)
    code = rt.eval(b"string.dump(function() return {name='bin'} end)")
    path = tmp_path / "bin.lua"
    path.write_bytes(code)
    with pytest.raises(AdapterLoadError, match=r"^bin\.lua: .*(binary|wrong mode)"):
        load_adapter(path, limits=SandboxLimits(engine=engine), allow_hosts={})  # type: ignore[arg-type]


def test_python_objects_are_inert_even_if_leaked(engine: str) -> None:
    # The attribute filter refuses every attribute: a Python object that ever
    # reached a script could not be used to climb to builtins.
    sb = LuaSandbox("leak", SandboxLimits(engine=engine), AdapterServices("leak"))  # type: ignore[arg-type]
    sb._rt.globals()[b"leak"] = object()
    probe = sb._rt.eval(b"function() local ok, e = pcall(function() return leak.__class__ end) return ok end")
    assert probe() is False


def test_globals_not_shared_between_adapters(make_adapter) -> None:
    a = make_adapter("shared_value = 'from a' return 'ok'", name="a")
    b = make_adapter("return tostring(rawget(_G, 'shared_value'))", name="b")
    assert a.transform_request("") == "ok"
    assert b.transform_request("") == "nil"


def test_script_cannot_replace_json_of_other_adapter(make_adapter) -> None:
    a = make_adapter("json.encode = function() return 'hacked' end return 'ok'", name="a")
    b = make_adapter("return json.encode({1})", name="b")
    a.transform_request("")
    assert b.transform_request("") == "[1]"
