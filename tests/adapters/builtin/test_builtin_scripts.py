"""The scripts themselves: metadata, the shared block, openai/deepseek kept in step."""

from __future__ import annotations

import harness

SHARED_START = "-- ===== shared block"
SHARED_END = "-- ===== end of shared block ====="
FLAVOR_END = "-- ===== flavor header ends here"


def source(name: str) -> str:
    return (harness.registry().get(name).source).read_text()


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


def test_shared_block_is_identical_in_every_script():
    blocks = {}
    for name in harness.NAMES:
        s = source(name)
        blocks[name] = s[s.index(SHARED_START):s.index(SHARED_END)]
    assert len(set(blocks.values())) == 1


def test_deepseek_is_openai_with_another_flavor_header():
    o, d = source("openai"), source("deepseek")
    assert o[o.index(FLAVOR_END):] == d[d.index(FLAVOR_END):]
    assert 'local FLAVOR = "deepseek"' in d and 'local FLAVOR = "openai"' in o
