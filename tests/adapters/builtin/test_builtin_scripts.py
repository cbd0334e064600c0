"""The scripts themselves: metadata, shared code only in luxkit, openai/deepseek one family."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

from gelbridge._adapters import sandbox
from gelbridge._adapters.host import load_adapter
from gelbridge._adapters.sandbox import SandboxLimits
from testkit import builtin_harness as harness

LUXKIT = Path(sandbox.__file__).with_name("lua") / "luxkit.lua"


def source(name: str) -> str:
    return (harness.registry().get(name).source).read_text()


def luxkit_exports() -> list[str]:
    """The names in luxkit.lua's final ``return { name = name, ... }`` table."""
    text = LUXKIT.read_text()
    table = text[text.rindex("\nreturn {"):]
    return re.findall(r"(\w+) = \1\b", table)


def code_lines(text: str) -> list[str]:
    """Lines of Lua code: comments and blank lines dropped, indentation kept."""
    out = []
    for line in text.splitlines():
        code = line.split("--", 1)[0].rstrip() if not line.lstrip().startswith("--") else ""
        if code:
            out.append(code)
    return out


def test_every_builtin_loads_as_lux_native():
    expect = {"openai": ("bearer", "sse"), "deepseek": ("bearer", "sse"), "anthropic": ("x-api-key", "sse"),
              "gemini": ("x-goog-api-key", "sse"), "ollama": ("none", "ndjson")}
    for name, (auth, framing) in expect.items():
        a = harness.adapter(name)
        assert (a.format, a.options.auth, a.options.stream_format) == ("lux-ir-v1", auth, framing), name
        assert a.has_stream_transform
    g = harness.adapter("gemini")
    assert g.path_for("m", True) == "/models/{model}:streamGenerateContent?alt=sse"
    assert g.path_for("m", False) == "/models/{model}:generateContent"


def test_luxkit_exports_the_shared_helpers():
    names = set(luxkit_exports())
    assert {"error_kind", "lux_error", "lux_response", "error_response", "pdata", "args_string",
            "args_object", "safe_id", "text_of", "media_of", "emit", "stream_error",
            "openai_family"} <= names


@pytest.mark.parametrize("name", harness.NAMES)
def test_no_builtin_script_redefines_a_luxkit_helper(name: str):
    text = "\n".join(code_lines(source(name)))
    # `local a, b = luxkit.a, luxkit.b` (one or two lines): each alias must be the same helper
    alias = re.compile(r"local ([\w, ]+) =\s*((?:luxkit\.\w+(?:,\s*)?)+)\n")
    for lhs, rhs in alias.findall(text):
        assert [n.strip() for n in lhs.split(",")] == re.findall(r"luxkit\.(\w+)", rhs), (name, lhs)
    rest = alias.sub("\n", text)
    for helper in luxkit_exports():
        defines = re.compile(rf"\bfunction\s+(?:[\w.]+[.:])?{helper}\s*\(|\blocal\s+(?:[\w, ]+,\s*)?{helper}\b"
                             rf"|\b{helper}\s*=\s*function\b")
        assert not defines.search(rest), f"{name}.lua defines its own {helper}: use luxkit.{helper}"
    # nor a copy of the helper block's data
    assert "rate_limit_error" not in text and "TEXT_DELTA" not in text, name


def test_no_builtin_script_repeats_code_of_another_or_of_luxkit():
    """No 8 consecutive code lines (stripped; bare `end`/`else`/braces skipped) of one
    script stand again in another script or in luxkit: shared code lives in luxkit.
    (Shorter common runs are the idioms of walking a Lux request, not helpers.)"""
    window, trivial = 8, {"end", "else", "}", "},", "end)", "return adapter"}

    def runs(text: str) -> set[tuple[str, ...]]:
        lines = [ln.strip() for ln in code_lines(text) if ln.strip() not in trivial]
        return {tuple(lines[i:i + window]) for i in range(len(lines) - window + 1)}

    texts = {name: source(name) for name in harness.NAMES} | {"luxkit": LUXKIT.read_text()}
    seen: dict[tuple[str, ...], str] = {}
    for name, text in texts.items():
        for run in runs(text):
            other = seen.setdefault(run, name)
            assert other == name, f"{name} repeats lines of {other}:\n" + "\n".join(run)


PROBE = """
local adapter = { name = "probe" }
function adapter.transform_request(names_json)
  local globals = {}
  for _, lib in ipairs({ _G, string, table, math, os, coroutine, utf8 or {}, json }) do
    for k, v in pairs(lib) do if type(v) == "function" then globals[v] = k end end
  end
  local out = { kinds = json.object(), reexported = json.array(), writes = json.array() }
  for _, n in ipairs(json.decode(names_json)) do
    local v = luxkit[n]
    out.kinds[n] = type(v)
    if globals[v] then out.reexported[#out.reexported + 1] = n end
  end
  local before = luxkit.emit
  out.writes[1] = pcall(function() luxkit.emit = print end)
  out.writes[2] = pcall(function() luxkit.extra = 1 end)
  out.writes[3] = pcall(rawset, luxkit, "emit", print)
  out.writes[4] = pcall(setmetatable, luxkit, nil)
  out.writes[5] = pcall(table.insert, luxkit, print)
  out.same = luxkit.emit == before and rawget(luxkit, "emit") == nil and luxkit.extra == nil
    and rawget(luxkit, 1) == nil and next(luxkit) == nil
  out.metatable = getmetatable(luxkit)
  return json.encode(out)
end
function adapter.transform_response(s) return s end
return adapter
"""


def test_luxkit_is_read_only_from_a_script_and_reexports_no_library_function(tmp_path: Path):
    path = tmp_path / "probe.lua"
    path.write_text(PROBE)
    names = luxkit_exports()
    out = json.loads(load_adapter(path, limits=SandboxLimits(), allow_hosts={}).transform_request(json.dumps(names)))
    assert out["kinds"] == {n: "function" for n in names}
    assert out["reexported"] == []  # no global, library or json function handed out again
    assert out["writes"] == [False] * 5 and out["same"] is True
    assert out["metatable"] == "luxkit"


def test_openai_and_deepseek_differ_only_by_flavor_and_metadata():
    o, d = code_lines(source("openai")), code_lines(source("deepseek"))
    allowed = [r'\s*name = "(openai|deepseek)",', r'\s*tool_call_id = \{.*\},',
               r'local family = luxkit\.openai_family\("(openai|deepseek)"\)']
    changed = [ln[2:] for ln in difflib.ndiff(o, d) if ln[:2] in ("- ", "+ ")]
    assert changed, "the two scripts are expected to differ in name and flavor"
    for line in changed:
        assert any(re.fullmatch(p, line) for p in allowed), line
    assert 'luxkit.openai_family("openai")' in source("openai")
    assert 'luxkit.openai_family("deepseek")' in source("deepseek")
    oa, da = harness.adapter("openai"), harness.adapter("deepseek")
    assert (oa.endpoint, oa.headers, oa.options.format, oa.options.stream_format, oa.options.auth) == \
        (da.endpoint, da.headers, da.options.format, da.options.stream_format, da.options.auth)
