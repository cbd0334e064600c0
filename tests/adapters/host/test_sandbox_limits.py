"""Each limit stops a runaway script with SandboxViolation, and the adapter keeps working."""

from __future__ import annotations

import time

import pytest

from gelbridge._errors import SandboxViolation

RUNAWAYS = {
    "while_loop": "while true do end",
    "numeric_for_jit_candidate": "local n = 0 for i = 1, 1e15 do n = n + i end return tostring(n)",
    "nested_function": "local function spin(x) while x do x = x + 1 end end spin(1)",
    "inside_coroutine_wrap": "coroutine.wrap(function() while true do end end)()",
    "inside_coroutine_resume": "local c = coroutine.create(function() while true do end end) coroutine.resume(c) return 'swallowed'",
    "inside_gsub_callback": "string.gsub('aaa', 'a', function() while true do end end)",
    "inside_sort_comparator": "local t = {3, 2, 1} table.sort(t, function(a, b) while true do end end)",
    "pcall_swallowing": "while true do pcall(function() while true do end end) end",
    "xpcall_swallowing": "while true do xpcall(function() while true do end end, function(e) return e end) end",
    "error_handler_loop": "xpcall(function() error('x') end, function() while true do end end) return 'swallowed'",
    "metamethod": "local t = setmetatable({}, {__index = function() while true do end end}) return t.x",
    "json_decode_pcall": "while true do pcall(json.decode, '[1,2,3]') end",
}


@pytest.mark.parametrize("body", RUNAWAYS.values(), ids=RUNAWAYS.keys())
def test_runaway_stopped_by_time_limit(make_adapter, body: str) -> None:
    a = make_adapter("do " + body + " end\nreturn 'done'", time_limit=0.3, max_instructions=10**12)
    t0 = time.monotonic()
    with pytest.raises(SandboxViolation) as info:
        a.transform_request("")
    assert time.monotonic() - t0 < 2.0
    assert info.value.limit == "time"
    assert info.value.adapter == "t"


def test_instruction_limit(make_adapter) -> None:
    a = make_adapter("while true do end", time_limit=30.0, max_instructions=2_000_000)
    t0 = time.monotonic()
    with pytest.raises(SandboxViolation) as info:
        a.transform_request("")
    assert info.value.limit == "instructions"
    assert time.monotonic() - t0 < 5.0


def test_adapter_usable_after_violation(make_adapter) -> None:
    a = make_adapter("if raw == 'spin' then while true do end end return 'ok:' .. raw", time_limit=0.2)
    with pytest.raises(SandboxViolation):
        a.transform_request("spin")
    assert a.transform_request("x") == "ok:x"


MEMORY_BOMBS = {
    "table_of_strings": "local t = {} for i = 1, 1e8 do t[i] = ('x'):rep(64) .. i end",
    "concat_doubling": "local s = 'x' while true do s = s .. s end",
    "inside_pcall": "local t = {} pcall(function() for i = 1, 1e8 do t[i] = {i, i, i} end end) return 'swallowed'",
}


@pytest.mark.parametrize("body", MEMORY_BOMBS.values(), ids=MEMORY_BOMBS.keys())
def test_memory_bomb_stopped(make_adapter, body: str) -> None:
    a = make_adapter(
        "if raw == 'ok' then return 'fine' end\ndo " + body + " end\nreturn 'done'",
        max_memory=16 * 1024 * 1024, time_limit=20.0, max_instructions=10**12, max_string=1 << 30,
    )
    with pytest.raises(SandboxViolation) as info:
        a.transform_request("")
    assert info.value.limit == "memory"
    assert a.transform_request("ok") == "fine"


def test_catastrophic_pattern_stopped(make_adapter) -> None:
    # Unguarded, this backtracking search runs for minutes inside C, where no hook fires.
    a = make_adapter("return tostring(string.find(string.rep('a', 40), string.rep('(.-)', 12) .. 'b'))",
                     time_limit=1.0)
    t0 = time.monotonic()
    with pytest.raises(SandboxViolation) as info:
        a.transform_request("")
    assert info.value.limit == "pattern"
    assert time.monotonic() - t0 < 1.0


def test_catastrophic_method_call_and_gmatch_stopped(make_adapter) -> None:
    for body in (
        "local s = ('a'):rep(5000) return tostring(s:match('a*a*a*a*b'))",
        "local s = ('a'):rep(5000) for x in s:gmatch('a-a-a-b') do end return 'x'",
        "local s = ('a'):rep(200000) return tostring(s:find(('a'):rep(100000) .. 'b', 1, true))",
    ):
        with pytest.raises(SandboxViolation) as info:
            make_adapter(body, time_limit=1.0).transform_request("")
        assert info.value.limit == "pattern"


def test_ordinary_patterns_still_work(make_adapter) -> None:
    a = make_adapter(r"""
        local big = ('word '):rep(20000)
        local squashed = big:gsub('%s+', ' ')
        local payload = ('data: {"a":1}'):match('^data:%s*(.*)$')
        local found = big:find('word', 50000, true)
        local n = 0 for w in big:gmatch('%a+') do n = n + 1 end
        return payload .. ' ' .. #squashed .. ' ' .. found .. ' ' .. n
    """)
    assert a.transform_request("") == '{"a":1} 100000 50001 20000'


def test_huge_string_rep_stopped(make_adapter) -> None:
    for body in ("return string.rep('x', 1e9)", "return ('xy'):rep(2^40, ',')"):
        with pytest.raises(SandboxViolation) as info:
            make_adapter(body).transform_request("")
        assert info.value.limit == "string_size"


@pytest.mark.parametrize("max_memory", [0, 1, 100_000, 4 * 1024 * 1024 - 1])
def test_a_memory_limit_too_small_for_the_sandbox_itself_is_refused_before_lua_starts(max_memory: int) -> None:
    """Below 4 MB the prelude ran out of memory while lupa loaded it (a PANIC; 0 meant no limit)."""
    from gelbridge._adapters.sandbox import SandboxLimits
    from gelbridge._errors import AdapterError

    with pytest.raises(AdapterError, match="at least 4 MB"):
        SandboxLimits(max_memory=max_memory)


def test_the_config_refuses_a_memory_limit_below_4_mb() -> None:
    from gelbridge._config import Settings

    with pytest.raises(Exception, match="greater than or equal to 4"):
        Settings.model_validate({"adapters": {"memory_limit_mb": 1}})
