"""A thread of opened records → a Lux IR request (pure; PROTOCOL.md §3–5).

Rules (docs/protocol-decisions.md, "Records → Lux IR"):

- ``instructions`` = operator ``[defaults] instructions``, then the conversation's
  instruction text parts;
- a user message → one ``user`` message (text, images from opened blobs, files as
  their extracted text); approval parts are never sent, and a message left empty
  adds nothing;
- a reply → assistant turns: reasoning → ``thinking``, text → ``text`` (its
  ``sourcePart``s become url annotations), calls → ``tool_use``; after each turn one
  ``tool`` message per call, in call order. A text/reasoning/other part after a call
  starts the next turn (the next tool-loop step);
- every call has exactly one result: a waiting copy (``approval: pending``) is
  replaced, at its own position, by the repeated call of the next reply (or
  ``reply_prefix``) with that call's result; a call left without a result anywhere
  gets a synthetic error result "not run: …"; duplicate or empty call ids are
  renamed in the request;
- ``providerData`` of another provider/model is stripped
  (``strip_foreign_provider_data``).

Every loss is a ``Diagnostic`` naming the record part (``<rkey>.parts[i]``) or the
request field; details never hold user content.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from gelbridge._mapping.choice import TurnChoice
from gelbridge._mapping.provider_data import DecodedProviderData, decode_provider_data
from gelbridge._records.constants import (
    ROLE_ASSISTANT,
    ReplyStatus,
)
from gelbridge._records.models import (
    FilePart,
    ImagePart,
    MessageRecord,
    Part,
    PlainContent,
    ReasoningPart,
    SourcePart,
    TextPart,
    ToolApprovalPart,
    ToolCallPart,
    ToolResultPart,
    UnknownPart,
)
from gelbridge.lux import (
    Annotation,
    Content,
    ConversionStatus,
    Converted,
    Diagnostic,
    LuxRequest,
    Media,
    MediaSource,
    Message,
    Options,
    ReasoningConfig,
    Role,
    Text,
    Thinking,
    Tool,
    ToolResult,
    ToolUse,
    strip_foreign_provider_data,
)

_DEGRADED = ConversionStatus.DEGRADED
_UNSUPPORTED = ConversionStatus.UNSUPPORTED
_INVALID = ConversionStatus.INVALID
_USER, _ASSISTANT, _TOOL = Role.USER, Role.ASSISTANT, Role.TOOL

NOT_RUN_UNANSWERED = "not run: the call waited for the user's approval and was never answered"
NOT_RUN_APPROVED = "not run: the call was approved but has no result yet"
NOT_RUN_ENDED = "not run: the reply ended before the tool ran"

PREFIX_NAME = "reply_prefix"


class OpenedMessage(NamedTuple):
    """A message record of the thread with its content opened (the caller opens).
    A named tuple: immutable and cheap to build, one per message on every turn."""

    rkey: str
    record: MessageRecord
    content: PlainContent


# One message of the history as the builder sees it: (rkey, is a reply, parts, status).
# A plain tuple: built for every message of every turn.
_Segment = tuple[str, bool, Sequence[Part], str | None]


def _tool_json(t: Tool | Mapping[str, Any]) -> Tool:
    if isinstance(t, Tool):
        return t
    params = t.get("parameters")
    return Tool(
        name=str(t["name"]),
        parameters=dict(params) if isinstance(params, Mapping) else {"type": "object", "properties": {}},
        description=t.get("description"),
    )


def build_request(
    thread: Sequence[OpenedMessage],
    *,
    provider: str,
    model: str,
    choice: TurnChoice | None = None,
    instructions: str | None = None,
    conversation_instructions: PlainContent | None = None,
    tool_specs: Sequence[Tool | Mapping[str, Any]] = (),
    options: Options | None = None,
    blobs: Mapping[str, bytes] | None = None,
    reply_prefix: Sequence[Part] = (),
    cache_key: str | None = None,
) -> Converted[LuxRequest]:
    """The Lux IR request for the reply to the last message of ``thread``.

    ``provider``/``model``: the target (a ``[providers]`` key and model id, as in
    ``modelRef``); provider data of any other producer is stripped. ``choice`` gives
    the effort (→ ``reasoning``). ``instructions``: the operator's system prompt.
    ``tool_specs``: the declarations of the chosen tools (Lux ``Tool`` or
    ``{"name", "description", "parameters"}``). ``blobs``: opened blob bytes by CID
    (images, extracted text). ``reply_prefix``: parts already in the reply being
    written (repeated approved/denied calls with results, earlier tool-loop steps).
    ``cache_key``: the conversation's prompt-cache key (``prompt_cache_key``), sent as
    ``metadata.cache_key`` for the adapters that route caching by it.
    """
    b = _Builder(blobs or {})
    instr = b.instructions(instructions, conversation_instructions)
    segments: list[_Segment] = [
        (m.rkey, (rec := m.record).role == ROLE_ASSISTANT, m.content.parts, rec.status) for m in thread
    ]
    if reply_prefix:
        segments.append((PREFIX_NAME, True, reply_prefix, None))
    b.conversation(segments)
    tools = [_tool_json(t) for t in tool_specs]
    req = LuxRequest(
        model=model,
        conversation=b.out,  # type: ignore[arg-type]
        options=options if options is not None else Options(stream=True),
        instructions=instr or None,
        tools=tools or None,
        reasoning=ReasoningConfig.from_effort(choice.effort) if choice is not None else None,
        metadata={"cache_key": cache_key} if cache_key else None,
    )
    req, stripped = strip_foreign_provider_data(req, provider, model)
    return Converted(req, b.diags + stripped)


def prompt_cache_key(secret: bytes, account: str, conversation: str) -> str:
    """A stable prompt-cache key for one conversation of one account: the same for every
    turn (so a provider routes them to the same cache) and derived from no content.
    Keyed (HMAC-SHA256) with ``secret``, the conversation's sealing key: the account and
    conversation names are public in the repo, so a plain hash of them would let anyone
    link the provider's traffic to the account; without the key nobody can."""
    mac = hmac.new(secret, f"gelbridge-prompt-cache\n{account}\n{conversation}".encode(), hashlib.sha256)
    return f"gb-{mac.hexdigest()[:32]}"


def _part_path(rkey: str, pi: int, field: str = "") -> str:
    """A diagnostic's field for a record part: ``<rkey>.parts[i]`` (plus ``.field``).
    Built only when there is something to report."""
    return f"{rkey}.parts[{pi}].{field}" if field else f"{rkey}.parts[{pi}]"


class _Builder:
    __slots__ = ("blobs", "sent", "diags", "out", "emitted", "replacements", "consumed")

    def __init__(self, blobs: Mapping[str, bytes]) -> None:
        self.blobs = blobs
        # blob ref -> how the request already holds it: a blob named by many parts is sent
        # once (100 parts naming one 1 MiB text must not make a 100 MiB request)
        self.sent: dict[str, str] = {}
        self.diags: list[Diagnostic] = []
        self.out: list[Message] = []
        self.emitted: set[str] = set()  # call ids already in the request
        # (segment index, call id) -> (repeated call part, its result or None)
        self.replacements: dict[tuple[int, str], tuple[ToolCallPart, ToolResultPart | None]] = {}
        # segment index -> indexes of its parts already used as replacements
        self.consumed: dict[int, set[int]] = {}

    def note(self, field: str, status: ConversionStatus, detail: str, content: str | None = None) -> None:
        self.diags.append(Diagnostic(field, status, detail, content))

    # -- instructions --------------------------------------------------------------

    def instructions(self, operator: str | None, conv: PlainContent | None) -> list[Content]:
        out: list[Content] = []
        if operator:
            out.append(Text(operator))
        if conv is not None:
            for i, p in enumerate(conv.parts):
                if type(p) is TextPart:
                    out.append(Text(p.text))
                else:
                    self.note(f"conversation.instructions.parts[{i}]", _UNSUPPORTED,
                              "a part other than text in instructions; only text parts form the system prompt",
                              _type_name(p))
        return out

    # -- conversation -------------------------------------------------------------

    def conversation(self, segments: list[_Segment]) -> None:
        self.find_replacements(segments)
        for si, (rkey, is_reply, parts, status) in enumerate(segments):
            if is_reply:
                self.reply(si, rkey, parts, status)
            else:
                self.user(rkey, parts)

    def find_replacements(self, segments: list[_Segment]) -> None:
        """Pair each waiting call with its repeated copy in the next reply of the thread."""
        prev_reply: int | None = None
        for si, (_, is_reply, parts, _) in enumerate(segments):
            if not is_reply:
                continue
            if prev_reply is not None:
                waiting = _waiting_ids(segments[prev_reply][2])
                if waiting:
                    self.pair_repeated_calls(prev_reply, waiting, si, parts)
            prev_reply = si

    def pair_repeated_calls(self, prev_reply: int, waiting: set[str], si: int, parts: Sequence[Part]) -> None:
        """Take the repeated copies (and results) of reply ``prev_reply``'s waiting calls
        from reply ``si``: they are sent in place of the waiting copies, not again here."""
        results: dict[str, int] = {}
        for pi, p in enumerate(parts):
            if type(p) is ToolResultPart and p.call_id in waiting and p.call_id not in results:
                results[p.call_id] = pi
        consumed = self.consumed.setdefault(si, set())
        for pi, p in enumerate(parts):
            if (type(p) is ToolCallPart and p.call_id in waiting and p.approval != "pending"
                    and (prev_reply, p.call_id) not in self.replacements):
                ri = results.get(p.call_id)
                res = parts[ri] if ri is not None else None
                self.replacements[(prev_reply, p.call_id)] = (p, res)  # type: ignore[assignment]
                consumed.add(pi)
                if ri is not None:
                    consumed.add(ri)

    def user(self, rkey: str, parts: Sequence[Part]) -> None:
        blocks: list[Content] = []
        content_parts = _CONTENT_PARTS
        for pi, p in enumerate(parts):
            t = type(p)
            if t is ToolApprovalPart:
                continue  # answers go to the approval resolution, not to the model
            if t is ToolCallPart or t is ToolResultPart:
                self.note(_part_path(rkey, pi), _INVALID, "a tool call or result in a user message; left out",
                          _type_name(p))
                continue
            content_parts.get(t, _Builder.other)(self, p, rkey, pi, blocks)
        if blocks:
            self.out.append(Message(_USER, blocks))

    def reply(self, si: int, rkey: str, parts: Sequence[Part], status: str | None) -> None:
        if status not in (None, ReplyStatus.COMPLETE, ReplyStatus.AWAITING_APPROVAL) and parts:
            self.note(rkey, _DEGRADED, f"reply has status {status}; its partial content is included")
        consumed = self.consumed.get(si) or ()
        results = self.own_results(parts, rkey, consumed)
        blocks: list[Content] = []  # the current assistant turn
        calls: list[ToolResult] = []  # the results of its calls, in call order
        content_parts = _CONTENT_PARTS
        for pi, p in enumerate(parts):
            if pi in consumed:
                continue
            t = type(p)
            if t is ToolCallPart:
                self.call(si, rkey, pi, p, results, blocks, calls)  # type: ignore[arg-type]
            elif t is ToolResultPart:
                pass  # placed after its call's turn
            elif t is ToolApprovalPart:
                self.note(_part_path(rkey, pi), _INVALID, "toolApprovalPart in a reply; left out")
            else:
                if calls and t is not SourcePart:
                    self.end_turn(blocks, calls)  # the next tool-loop step
                    blocks, calls = [], []
                content_parts.get(t, _Builder.other)(self, p, rkey, pi, blocks)
        self.end_turn(blocks, calls)

    def own_results(self, parts: Sequence[Part], rkey: str, consumed: Collection[int]) -> dict[str, ToolResultPart]:
        """The results of this reply's own calls by call id; stray results are reported."""
        results: dict[str, ToolResultPart] = {}
        if ToolResultPart not in map(type, parts):  # the usual case, checked cheaply
            return results
        call_ids = {p.call_id for p in parts if type(p) is ToolCallPart}
        for pi, r in enumerate(parts):
            if type(r) is not ToolResultPart or pi in consumed:
                continue
            if r.call_id in results:
                self.note(_part_path(rkey, pi), _INVALID, "second result for one call; left out")
            elif r.call_id not in call_ids:
                self.note(_part_path(rkey, pi), _INVALID, "result without a call in this reply; left out")
            else:
                results[r.call_id] = r
        return results

    def end_turn(self, blocks: list[Content], calls: list[ToolResult]) -> None:
        """Emit one assistant turn, then one tool message per call."""
        out = self.out
        if blocks:
            out.append(Message(_ASSISTANT, blocks))
        for tr in calls:
            out.append(Message(_TOOL, [tr]))

    def call(
        self,
        si: int,
        rkey: str,
        pi: int,
        p: ToolCallPart,
        results: dict[str, ToolResultPart],
        blocks: list[Content],
        calls: list[ToolResult],
    ) -> None:
        call = p
        res = results.get(p.call_id)
        synthetic: str | None = None
        if res is None:
            rep = self.replacements.get((si, p.call_id))
            if rep is not None:
                call, res = rep
                if res is None:
                    synthetic = NOT_RUN_APPROVED if call.approval == "approved" else NOT_RUN_ENDED
            elif p.approval == "pending":
                synthetic = NOT_RUN_UNANSWERED
            elif p.approval == "approved":
                synthetic = NOT_RUN_APPROVED
            else:
                synthetic = NOT_RUN_ENDED
        rid = call.call_id
        if not rid or rid in self.emitted:
            rid = self.rename_call(rid, rkey, pi)
        self.emitted.add(rid)
        pd = None
        if call.provider_data is not None:
            pd = self._provider_data(call.provider_data, rkey, pi)
        blocks.append(ToolUse(rid, call.tool, call.input, pd.provider_data if pd is not None else None))
        if synthetic is not None:
            self.note(_part_path(rkey, pi), _DEGRADED, f"call has no result; answered as '{synthetic}'")
            calls.append(ToolResult(rid, [Text(synthetic)], True))
            return
        assert res is not None
        if res.output_blob is not None:
            self.note(_part_path(rkey, pi, "outputBlob"), _DEGRADED,
                      "full output blob not sent; the summary in output is")
        calls.append(ToolResult(rid, [Text(res.output)], res.is_error))

    def rename_call(self, rid: str, rkey: str, pi: int) -> str:
        """A request id for a call whose id is empty or already used (reported)."""
        base = rid or f"call_{_safe(rkey)}_{pi}"
        n = 1
        new = base if base not in self.emitted else f"{base}_{n}"
        while new in self.emitted:
            n += 1
            new = f"{base}_{n}"
        self.note(_part_path(rkey, pi, "callId"), _DEGRADED,
                  "empty call id given one in the request" if not rid
                  else "call id used by an earlier call; renamed in the request")
        return new

    # -- single parts ------------------------------------------------------------------

    def _provider_data(self, text: str, rkey: str, pi: int) -> DecodedProviderData | None:
        try:
            return decode_provider_data(text)
        except ValueError as e:
            self.note(_part_path(rkey, pi, "providerData"), _INVALID, f"{e}; not sent")
            return None

    # Each appends the Lux block(s) of one content part to ``blocks`` (dispatched by
    # part type through _CONTENT_PARTS) or reports why it cannot.

    def text(self, p: TextPart, rkey: str, pi: int, blocks: list[Content]) -> None:
        pd = self._provider_data(p.provider_data, rkey, pi) if p.provider_data else None
        blocks.append(Text(p.text, None, pd.provider_data if pd is not None else None))

    def reasoning(self, p: ReasoningPart, rkey: str, pi: int, blocks: list[Content]) -> None:
        text = p.text or ""
        d = self._provider_data(p.provider_data, rkey, pi) if p.provider_data is not None else None
        if d is None:
            if text:
                blocks.append(Thinking(text))
        elif d.summary and text:
            blocks.append(Thinking("", d.redacted, d.signature, [Text(text)], d.provider_data))
        else:
            blocks.append(Thinking(text, d.redacted, d.signature, None, d.provider_data))

    def source(self, p: SourcePart, rkey: str, pi: int, blocks: list[Content]) -> None:
        last = blocks[-1] if blocks else None
        if type(last) is Text:
            ann = Annotation("url", p.title, p.url)
            if last.annotations is None:
                last.annotations = [ann]
            else:
                last.annotations.append(ann)
        else:
            self.note(_part_path(rkey, pi), _UNSUPPORTED, "sourcePart without a text part before it; left out")

    def _sent_before(self, ref: str, label: str, rkey: str, pi: int, blocks: list[Content]) -> bool:
        """True for a blob the request already holds: a pointer back to it goes in
        instead of a copy. False (and remembered) for its first use."""
        first = self.sent.get(ref)
        if first is None:
            self.sent[ref] = label
            return False
        blocks.append(Text(f"{label} (the same content as {first} above)"))
        self.note(_part_path(rkey, pi), _DEGRADED, "the same blob as an earlier part; sent once")
        return True

    def image(self, p: ImagePart, rkey: str, pi: int, blocks: list[Content]) -> None:
        data = self.blobs.get(p.image.ref)
        if data is None:
            if p.alt:
                blocks.append(Text(f"[image: {p.alt}]"))
            self.note(_part_path(rkey, pi), _UNSUPPORTED,
                      "image blob not available; left out" + (" (its alt text is sent)" if p.alt else ""))
            return
        if self._sent_before(p.image.ref, "[image]", rkey, pi, blocks):
            return
        blocks.append(Media("image", p.image.mime_type,
                            MediaSource("inline", base64.b64encode(data).decode("ascii"))))

    def file(self, p: FilePart, rkey: str, pi: int, blocks: list[Content]) -> None:
        name = p.name or "attachment"
        if p.extracted is None:
            self.note(_part_path(rkey, pi), _UNSUPPORTED, "file has no extracted text; left out", p.file.mime_type)
            return
        data = self.blobs.get(p.extracted.text.ref)
        if data is None:
            self.note(_part_path(rkey, pi), _UNSUPPORTED, "extracted-text blob not available; file left out")
            return
        if self._sent_before(p.extracted.text.ref, f"[file: {name}]", rkey, pi, blocks):
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            self.note(_part_path(rkey, pi, "extracted"), _DEGRADED,
                      "extracted text is not valid UTF-8; bad bytes replaced")
        blocks.append(Text(f"[file: {name}]\n{text}"))

    def unknown(self, p: UnknownPart, rkey: str, pi: int, blocks: list[Content]) -> None:
        self.note(_part_path(rkey, pi), _UNSUPPORTED, "a part of a type this gelbridge does not know; left out",
                  p.type)

    def other(self, p: Part, rkey: str, pi: int, blocks: list[Content]) -> None:
        self.note(_part_path(rkey, pi), _UNSUPPORTED, "a part the model request cannot carry; left out",
                  _type_name(p))


# Content part type -> the _Builder method that maps it (any other type: ``other``).
_CONTENT_PARTS: dict[type, Callable[[_Builder, Any, str, int, list[Content]], None]] = {
    TextPart: _Builder.text,
    ReasoningPart: _Builder.reasoning,
    SourcePart: _Builder.source,
    ImagePart: _Builder.image,
    FilePart: _Builder.file,
    UnknownPart: _Builder.unknown,
}


def _waiting_ids(parts: Sequence[Part]) -> set[str]:
    if ToolCallPart not in map(type, parts):  # the usual case, checked cheaply
        return set()
    waiting = {p.call_id for p in parts if type(p) is ToolCallPart and p.approval == "pending"}
    if waiting:
        waiting.difference_update([p.call_id for p in parts if type(p) is ToolResultPart])
    return waiting


def _type_name(p: Any) -> str:
    t = getattr(p, "type", None)
    if isinstance(t, str):
        return t.rpartition("#")[2] or t
    return type(p).__name__


_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def _safe(rkey: str) -> str:
    return _UNSAFE_ID_CHARS.sub("_", rkey)
