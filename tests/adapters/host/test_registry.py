"""Loading directories of scripts: failures are reported, overrides follow the documented order."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge._errors import AdapterError


def script(name: str, version: str = "1", extra: str = "") -> str:
    return (
        f"local a = {{ name = {name!r}, version = {version!r} }}\n{extra}"
        "function a.transform_request(s) return s end\n"
        "function a.transform_response(s) return s end\n"
        "return a\n"
    )


def write(d: Path, fname: str, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / fname
    p.write_text(text)
    return p


def test_failures_reported_with_file_and_line_and_others_load(tmp_path: Path) -> None:
    d = tmp_path / "custom"
    write(d, "a_good.lua", script("good"))
    write(d, "b_syntax.lua", "local a = {\nname = 'x'\nfunction")
    write(d, "c_runtime.lua", "local a = {}\n\nlocal x = nil + 1\nreturn a")
    write(d, "d_missing.lua", "return { name = 'm', transform_request = function(s) return s end }")
    write(d, "e_good.lua", script("good2"))
    reg = AdapterRegistry.load(None, [d], limits=SandboxLimits())
    assert reg.names() == ["good", "good2"]
    by_file = {e.source.name: e for e in reg.entries()}
    assert by_file["b_syntax.lua"].status == "failed"
    assert by_file["b_syntax.lua"].error.startswith("b_syntax.lua:3:")
    assert by_file["c_runtime.lua"].error.startswith("c_runtime.lua:3: attempt to perform arithmetic")
    assert "transform_response is missing" in by_file["d_missing.lua"].error
    assert [e.source.name for e in reg.entries()] == sorted(by_file)


@pytest.mark.parametrize("extra,needle", [
    ("a.name = 5\n", "adapter.name must be a non-empty string, got number"),
    ("a.endpoint = {}\n", "adapter.endpoint must be a string, got table"),
    ("a.headers = 'x'\n", "adapter.headers must be a table, got string"),
    ("a.headers = {1}\n", "adapter.headers must map strings to strings"),
    ("a.version = {}\n", "adapter.version must be a string"),
    ("a.transform_stream_chunk = 'no'\n", "adapter.transform_stream_chunk must be a function"),
    ("a.probe = 'v1/models'\n", "adapter.probe must be a path starting with '/'"),
    ("a.probe = true\n", "adapter.probe must be a path starting with '/'"),
])
def test_bad_contract_types(tmp_path: Path, extra: str, needle: str) -> None:
    text = script("n").replace("return a\n", extra + "return a\n")
    write(tmp_path, "bad.lua", text)
    entry = AdapterRegistry.load(None, [tmp_path]).entries()[0]
    assert entry.status == "failed"
    assert entry.error == f"bad.lua: {needle}" or needle in (entry.error or "")


def test_script_must_return_table(tmp_path: Path) -> None:
    write(tmp_path, "x.lua", "return 'nope'")
    assert "must return the adapter table, got string" in AdapterRegistry.load(None, [tmp_path]).entries()[0].error


def test_custom_overrides_builtin_and_later_dir_wins(tmp_path: Path) -> None:
    builtin = tmp_path / "builtin"
    first, second = tmp_path / "c1", tmp_path / "c2"
    write(builtin, "openai.lua", script("openai", "builtin"))
    write(builtin, "other.lua", script("other", "b"))
    write(first, "mine.lua", script("openai", "first"))
    write(second, "zzz.lua", script("openai", "second"))
    reg = AdapterRegistry.load(builtin, [first, second, tmp_path / "missing"])
    assert reg.get("openai").version == "second"
    assert reg.get("openai").source == second / "zzz.lua"
    statuses = {(e.source.parent.name, e.status) for e in reg.entries()}
    assert statuses == {("builtin", "overridden"), ("builtin", "loaded"), ("c1", "overridden"), ("c2", "loaded")}
    over = [e for e in reg.entries() if e.source.name == "openai.lua"][0]
    assert over.builtin and over.overridden_by == first / "mine.lua"


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    write(tmp_path, "stem.lua", script("x").replace("name = 'x', ", ""))
    assert AdapterRegistry.load(None, [tmp_path]).names() == ["stem"]


def test_get_unknown_lists_known_names(tmp_path: Path) -> None:
    write(tmp_path, "a.lua", script("alpha"))
    write(tmp_path, "b.lua", "syntax error here")
    reg = AdapterRegistry.load(None, [tmp_path])
    with pytest.raises(AdapterError, match=r"no adapter named 'beta' \(loaded: alpha\); 1 script\(s\) failed"):
        reg.get("beta")


def test_script_size_cap(tmp_path: Path) -> None:
    write(tmp_path, "big.lua", script("big") + "--" + "x" * 2000 + "\n")
    entry = AdapterRegistry.load(None, [tmp_path], limits=SandboxLimits(max_script_bytes=1000)).entries()[0]
    assert entry.status == "failed" and "larger than the 1000-byte script limit" in entry.error


def test_load_time_runaway_is_a_failed_entry(tmp_path: Path) -> None:
    write(tmp_path, "spin.lua", "while true do end")
    write(tmp_path, "ok.lua", script("ok"))
    reg = AdapterRegistry.load(None, [tmp_path], limits=SandboxLimits(time_limit=0.2))
    assert reg.names() == ["ok"]
    assert "time limit" in reg.entries()[1].error


def test_builtin_dir_found_in_repo() -> None:
    d = builtin_adapters_dir()
    assert d.is_dir() and d.name == "adapters"


def test_cli_adapters_list(tmp_path: Path) -> None:
    from gelbridge._cli import app

    custom = tmp_path / "mine"
    write(custom, "good.lua", script("mine_good", "3.1"))
    write(custom, "broken.lua", "local x = \n")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[adapters]\ndirs = ["mine"]\n')
    result = CliRunner().invoke(app, ["adapters", "list", "--config", str(cfg)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "mine_good" in result.output and "3.1" in result.output
    assert "failed" in result.output and "broken.lua:2:" in result.output
