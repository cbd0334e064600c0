"""Hypothesis strategies for Lux IR values in gelbridge's canonical form.

``strict=True`` keeps to what the reference schema can express (no media, native
blocks, native enum strings or xhigh), so those values must validate against the
unpatched schema.
"""

from __future__ import annotations

from hypothesis import strategies as st

from gelbridge.lux import (
    AgentAction,
    Annotation,
    Capabilities,
    Choice,
    LuxError,
    LuxRequest,
    LuxResponse,
    Media,
    MediaSource,
    Message,
    Native,
    Options,
    ProviderData,
    ReasoningConfig,
    Refusal,
    SafetyRating,
    StructuredOutput,
    Text,
    Thinking,
    Tool,
    ToolChoice,
    ToolResult,
    ToolUse,
    Usage,
)

text = st.text(max_size=12)
ident = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)
small = st.integers(min_value=0, max_value=10**6)
json_leaf = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=6)
json_obj = st.dictionaries(ident, json_leaf, max_size=3)


def native_or(known: list[str], strict: bool) -> st.SearchStrategy[str]:
    s = st.sampled_from(known)
    return s if strict else s | ident.map(lambda x: "x_" + x)


provider_data = st.builds(ProviderData, ident, ident, json_obj)
annotation = st.builds(Annotation, st.sampled_from(["url", "file_citation", "web_search_citation"]),
                       st.none() | text, st.none() | text, st.none() | small, st.none() | small)


def text_block(strict: bool):
    return st.builds(Text, text, st.none() | st.lists(annotation, max_size=2),
                     st.none() | provider_data)


tool_use = st.builds(ToolUse, ident.map(lambda x: "call_" + x), ident,
                     st.sampled_from(["{}", '{"a":1}', '{"q":"x y"}']), st.none() | provider_data)


def thinking(strict: bool):
    return st.builds(Thinking, text, st.booleans(), st.none() | text,
                     st.none() | st.lists(st.builds(Text, text), max_size=2), st.none() | provider_data)


def leaf_block(strict: bool):
    blocks = [text_block(strict), st.builds(Refusal, text)]
    if not strict:
        blocks.append(st.builds(Media, st.sampled_from(["image", "audio", "video", "file"]), ident,
                                st.builds(MediaSource, st.sampled_from(["inline", "url", "file_uri"]), text)))
        blocks.append(st.builds(Native, ident, st.none() | json_obj))
    return st.one_of(blocks)


def assistant_message(strict: bool):
    block = st.one_of(leaf_block(strict), tool_use, thinking(strict))
    return st.builds(Message, st.just("assistant"), st.lists(block, max_size=4),
                     st.none() | st.sampled_from(["commentary", "final_answer"]))


def tool_message(strict: bool):
    result = st.builds(ToolResult, ident.map(lambda x: "res_" + x),
                       st.lists(leaf_block(strict), max_size=2), st.booleans())
    return st.builds(Message, st.just("tool"), result.map(lambda r: [r]))


def other_message(strict: bool):
    role = native_or(["user", "developer", "model"], strict)
    return st.builds(Message, role, st.lists(leaf_block(strict), max_size=3))


agent_action = st.builds(AgentAction, ident, ident, st.none() | ident, st.none() | ident,
                         st.none() | text, st.none() | text, st.none() | json_obj)


def conversation(strict: bool):
    item = st.one_of(assistant_message(strict), tool_message(strict), other_message(strict), agent_action)
    # a leading message is never a system message: those are hoisted into instructions
    return st.lists(item, max_size=6)


def tool(strict: bool):
    kinds = ["function"] if strict else ["function", "web_search", "mcp", "x_custom"]
    return st.builds(Tool, ident, st.just({"type": "object", "properties": {}}) | json_obj,
                     st.none() | text, st.none() | st.booleans(), st.sampled_from(kinds))


tool_choice = st.one_of(st.builds(ToolChoice, st.sampled_from(["auto", "none", "required"])),
                        ident.map(ToolChoice.specific))
structured_output = st.one_of(
    st.builds(StructuredOutput, st.sampled_from(["json_object", "text"])),
    st.builds(StructuredOutput, st.just("json_schema"), json_obj, st.none() | ident, st.none() | st.booleans()),
)
floats = st.floats(0, 2, allow_nan=False)
options = st.builds(Options, st.booleans(), st.none() | floats, st.none() | floats, st.none() | small,
                    st.none() | small, st.none() | st.lists(text, max_size=2), st.none() | small,
                    st.none() | small, st.none() | structured_output, st.none() | st.booleans(),
                    st.none() | json_obj)


def reasoning(strict: bool):
    efforts = ["low", "medium", "high"] + ([] if strict else ["xhigh", "x_minimal"])
    return st.builds(ReasoningConfig, st.booleans(), st.none() | small, st.none() | st.sampled_from(efforts),
                     st.none() | st.sampled_from(["auto", "concise", "detailed"]))


levels = st.sampled_from(["full", "partial", "none"])
modalities = st.lists(st.sampled_from(["text", "image", "audio", "video", "pdf"]), max_size=3)
capabilities = st.builds(Capabilities, levels, levels, levels, levels, levels, modalities, modalities)


def requests(strict: bool = False):
    return st.builds(
        LuxRequest, ident, conversation(strict), options,
        st.none() | st.lists(st.builds(Text, text), max_size=2),
        st.none() | st.lists(tool(strict), max_size=2), st.none() | tool_choice,
        st.none() | capabilities, st.none() | reasoning(strict),
        st.none() | st.dictionaries(ident, text, max_size=2), st.none() | json_obj,
    )


usage = st.builds(Usage, small, small, small, st.none() | small, st.none() | small, st.none() | small)


def responses(strict: bool = False):
    finish = native_or(["stop", "length", "tool_calls", "content_filter", "safety", "recitation",
                        "malformed_tool_call", "error"], strict)
    choice = st.builds(Choice, st.integers(0, 3), assistant_message(strict), finish,
                       st.none() | st.lists(st.builds(SafetyRating, ident, ident), max_size=2))
    kinds = native_or(["rate_limit", "invalid_request", "authentication", "server_error", "content_filter"], strict)
    return st.builds(LuxResponse, ident, ident, st.lists(choice, min_size=1, max_size=2), st.none() | small,
                     st.none() | usage, st.none() | json_obj,
                     st.none() | st.builds(LuxError, kinds, text, st.none() | ident))
