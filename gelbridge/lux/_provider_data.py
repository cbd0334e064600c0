"""Keep opaque provider state away from providers that did not produce it.

PROTOCOL.md §5: ``providerData`` (signatures, encrypted reasoning) is sent back only
to the provider and model that produced it. In Lux IR that state is the
``provider_data`` field of text, tool_use and thinking blocks, plus a thinking
block's ``signature`` and redacted text, which belong to the block's
``provider_data`` tag (a bare signature without a tag counts as foreign).
"""

from __future__ import annotations

from dataclasses import replace

from gelbridge.lux._diagnostics import ConversionStatus, Diagnostic
from gelbridge.lux._models import Content, LuxRequest, Message, Text, Thinking, ToolResult, ToolUse

_DEGRADED = ConversionStatus.DEGRADED


def strip_foreign_provider_data(
    request: LuxRequest, provider: str, model: str
) -> tuple[LuxRequest, list[Diagnostic]]:
    """Return a copy of ``request`` without provider state foreign to provider+model.

    Foreign redacted or signature-only thinking blocks are dropped (their text is
    unreadable and would be rejected elsewhere); foreign visible thinking keeps its
    text without signature. One ``degraded`` diagnostic per removal. The input is
    not modified.
    """
    if not _any_foreign_request(request, provider, model):
        return request, []  # the common case: one cheap scan, no copy
    diags: list[Diagnostic] = []
    instructions = request.instructions
    if instructions is not None:
        instructions = _strip_list(instructions, "instructions", provider, model, diags)
    conversation = []
    for i, item in enumerate(request.conversation):
        if type(item) is Message:
            path = f"conversation[{i}].message.content"
            content = _strip_list(item.content, path, provider, model, diags)
            if content is not item.content:
                item = replace(item, content=content)
        conversation.append(item)
    if not diags:
        return request, diags
    return replace(request, instructions=instructions, conversation=conversation), diags


def _any_foreign_request(request: LuxRequest, provider: str, model: str) -> bool:
    if request.instructions and _any_foreign(request.instructions, provider, model):
        return True
    for item in request.conversation:
        if type(item) is Message and _any_foreign(item.content, provider, model):
            return True
    return False


def _any_foreign(blocks: list[Content], provider: str, model: str) -> bool:
    """Whether ``_strip_list`` would change anything in ``blocks`` (no paths built)."""
    for b in blocks:
        if type(b) is Text or type(b) is ToolUse:
            pd = b.provider_data
            if pd is not None and (pd.provider != provider or pd.model != model):
                return True
        elif type(b) is Thinking:
            pd = b.provider_data
            if pd is not None:
                if pd.provider != provider or pd.model != model:
                    return True
            elif b.signature is not None or b.redacted:
                return True
            elif b.summary and _any_foreign(b.summary, provider, model):
                return True
        elif type(b) is ToolResult:
            if b.content and _any_foreign(b.content, provider, model):
                return True
    return False


def _strip_list(
    blocks: list[Content], path: str, provider: str, model: str, diags: list[Diagnostic]
) -> list[Content]:
    """The stripped list, or ``blocks`` itself when nothing changed."""
    out: list[Content] = []
    changed = False
    for j, b in enumerate(blocks):
        nb = _strip_block(b, f"{path}[{j}]", provider, model, diags)
        if nb is not b:
            changed = True
        if nb is not None:
            out.append(nb)
    return out if changed else blocks


def _strip_block(
    b: Content, path: str, provider: str, model: str, diags: list[Diagnostic]
) -> Content | None:
    if type(b) is Thinking:
        pd = b.provider_data
        if pd is not None and pd.owned_by(provider, model):
            return b
        if pd is None and b.signature is None and not b.redacted:
            if b.summary:
                summary = _strip_list(b.summary, f"{path}.thinking.summary", provider, model, diags)
                if summary is not b.summary:
                    return replace(b, summary=summary)
            return b
        origin = "from another provider or model" if pd is not None else "with no provider tag"
        came = f"{pd.provider}/{pd.model}" if pd is not None else None  # sealed: shown on request only
        if b.opaque_only:
            diags.append(Diagnostic(path, _DEGRADED,
                                    f"redacted or signature-only thinking {origin} dropped", came))
            return None
        diags.append(Diagnostic(path, _DEGRADED,
                                f"signature/provider_data {origin} removed; thinking text kept", came))
        kept = _strip_list(b.summary, f"{path}.thinking.summary", provider, model, diags) if b.summary else b.summary
        return replace(b, signature=None, provider_data=None, summary=kept)
    if type(b) is Text or type(b) is ToolUse:
        pd = b.provider_data
        if pd is None or pd.owned_by(provider, model):
            return b
        diags.append(Diagnostic(f"{path}.provider_data", _DEGRADED,
                                "provider_data from another provider or model removed", f"{pd.provider}/{pd.model}"))
        return replace(b, provider_data=None)
    if type(b) is ToolResult:
        content = _strip_list(b.content, f"{path}.tool_result.content", provider, model, diags)
        return b if content is b.content else replace(b, content=content)
    return b
