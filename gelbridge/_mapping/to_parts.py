"""A Lux IR response → the parts of a reply (pure; PROTOCOL.md §4–5).

- thinking → ``reasoningPart``; its opaque state (provider_data, signature, redacted,
  summary) → the ``providerData`` string tagged with the request's provider and model
  (``mapping.provider_data``); redacted/signature-only thinking is kept;
- text → ``textPart`` (split at 500000 UTF-8 bytes), its url annotations →
  ``sourcePart``s right after it, each url once per reply, at most 256 per reply, and
  only ``http``/``https`` URLs of at most 2048 bytes with no whitespace or control
  characters; titles lose control and format characters and are cut to the lexicon's
  bound (``SourcePolicy``; what was left out is counted in the diagnostics, never named);
- refusal → ``textPart`` (degraded); tool_use → ``toolCallPart`` with an id that is
  unique in the conversation and stable once written (the provider's id if it is
  usable, else ``call_<reply rkey>_<n>``), ``approval: pending`` when the tool needs
  approval; a call whose name is not a valid tool name (``tools.registry.is_tool_name``)
  or whose arguments are too large is answered at once with an error result, never run
  nor asked about (its name written as ``invalid_tool_name``: shown to the user and sent
  back to providers, which check the names of the history);
- finish reason → the record's knownValues (Lux IR finish reasons); usage → record
  usage (input/output/reasoning tokens).

The parts array keeps to the lexicon's 1000 items; overflow is dropped and reported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gelbridge._mapping.provider_data import MAX_PROVIDER_DATA_BYTES, encode_provider_data
from gelbridge._records.models import (
    Part,
    ReasoningPart,
    SourcePart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
    grapheme_len,
    utf8_len,
)
from gelbridge._tools.registry import INVALID_TOOL_NAME, invalid_name_output, is_tool_name
from gelbridge.lux import (
    ConversionStatus,
    Diagnostic,
    FinishReason,
    LuxResponse,
    Media,
    ProviderData,
    Refusal,
    Text,
    Thinking,
    ToolUse,
    finish_reason_from_str,
)

MAX_PARTS = 1000
MAX_TEXT_BYTES = 500_000
MAX_INPUT_BYTES = 200_000
MAX_CALL_ID_BYTES = 256
MAX_TITLE_BYTES = 3000
MAX_TITLE_GRAPHEMES = 300
MAX_SOURCES = 256  # sourceParts in one reply
MAX_URL_BYTES = 2048

_DEGRADED = ConversionStatus.DEGRADED
_UNSUPPORTED = ConversionStatus.UNSUPPORTED
_INVALID = ConversionStatus.INVALID

INPUT_TOO_LARGE = "not run: the call's arguments are larger than 200000 bytes"

_KNOWN_FINISH_REASONS = frozenset(FinishReason)
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
#: C0/C1 controls (ESC, BEL...) and the invisible format characters (bidi overrides and
#: isolates, zero-width characters, tags) that can make a URL or a title show something
#: other than what it is
_CONTROLS = r"\x00-\x1f\x7f-\x9f"
_FORMATS = (r"\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
            r"\U000e0000-\U000e007f")
#: scheme and a host (no ``user@`` before it, which can dress one host up as another)
_URL_START = re.compile(r"https?://[^/?#@\s]+(?:[/?#]|\Z)", re.IGNORECASE)
_URL_UNSAFE = re.compile(rf"[\s{_CONTROLS}{_FORMATS}]")
_TITLE_FORMATS = re.compile(rf"[{_FORMATS}]+")
_TITLE_SPACES = re.compile(rf"[\s{_CONTROLS}]+")


@dataclass(slots=True)
class ReplyDraft:
    """What one model response adds to a reply."""

    parts: list[Part]
    finish_reason: str | None
    usage: Usage | None
    awaiting_approval: bool
    pending_calls: list[ToolCallPart] = field(default_factory=list)
    runnable_calls: list[ToolCallPart] = field(default_factory=list)
    #: calls answered here with an error result, never run: arguments too large, a name
    #: that is not a valid tool name (the model sees the result in the next step)
    answered_calls: list[ToolCallPart] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)


def split_text(text: str, max_bytes: int = MAX_TEXT_BYTES) -> list[str]:
    """``text`` in pieces of at most ``max_bytes`` UTF-8 bytes, never splitting a character."""
    if len(text) <= max_bytes // 4 or utf8_len(text) <= max_bytes:
        return [text]
    out: list[str] = []
    data = text.encode("utf-8", "surrogatepass")
    start = 0
    while start < len(data):
        end = min(start + max_bytes, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:  # continuation byte
            end -= 1
        out.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return out


def _safe_rkey(rkey: str) -> str:
    """``rkey`` with every character other than ASCII letters, digits, ``_``, ``-`` as ``_``."""
    return _UNSAFE_ID_CHARS.sub("_", rkey)


def _usable_call_id(cid: str) -> bool:
    return bool(cid) and cid.isprintable() and utf8_len(cid) <= MAX_CALL_ID_BYTES


class CallIds:
    """Call ids unique within a conversation: keep a usable, unused provider id, else
    generate ``call_<reply rkey>_<n>``. Persisted in the part, so never regenerated."""

    __slots__ = ("used", "reply_rkey", "n")

    def __init__(self, reply_rkey: str, used: Collection[str] = ()) -> None:
        self.used = set(used)
        self.reply_rkey = reply_rkey
        self.n = 0

    def take(self, provider_id: str | None) -> str:
        if provider_id and _usable_call_id(provider_id) and provider_id not in self.used:
            self.used.add(provider_id)
            return provider_id
        prefix = f"call_{_safe_rkey(self.reply_rkey)}_"  # only here: provider ids are usually kept
        while True:
            cid = f"{prefix}{self.n}"
            self.n += 1
            if cid not in self.used:
                self.used.add(cid)
                return cid


def map_finish_reason(reason: str | None) -> str | None:
    """The record's ``finishReason``: Lux IR values; other strings are kept (open knownValues)."""
    if reason is None:
        return None
    return str(finish_reason_from_str(reason))


def map_usage(usage: object) -> Usage | None:
    """Lux usage → record usage (input/output/reasoning tokens)."""
    if usage is None:
        return None
    return Usage(
        input_tokens=max(0, int(usage.prompt_tokens)),  # type: ignore[attr-defined]
        output_tokens=max(0, int(usage.completion_tokens)),  # type: ignore[attr-defined]
        reasoning_tokens=(max(0, int(usage.reasoning_tokens))  # type: ignore[attr-defined]
                          if usage.reasoning_tokens is not None else None),  # type: ignore[attr-defined]
    )


def response_to_parts(
    response: LuxResponse,
    *,
    provider: str,
    model: str,
    needs_approval: Callable[[str], bool],
    reply_rkey: str = "reply",
    used_call_ids: Collection[str] = (),
    call_ids: CallIds | None = None,
    sources: Mapping[str, str] | None = None,
    seen_urls: set[str] | None = None,
    max_parts: int = MAX_PARTS,
) -> ReplyDraft:
    """The parts for ``response`` (choice 0), in the model's order.

    ``provider``/``model``: the modelRef the request was made for; opaque state is
    tagged with it (so the next turn with the same modelRef sends it back).
    ``needs_approval(tool)``: True → the call is written ``pending`` and not run.
    ``reply_rkey``/``used_call_ids`` (every call id already in the conversation
    history and this reply) or a shared ``call_ids`` make generated ids unique.
    ``sources``: ``toolCallPart.source`` per tool name (MCP server URL/command).
    ``seen_urls``: urls already cited in this reply (shared across tool-loop steps).
    ``max_parts``: room left in the reply's parts array.
    """
    mapper = _PartsMapper(provider, model, needs_approval,
                          call_ids if call_ids is not None else CallIds(reply_rkey, used_call_ids),
                          SourcePolicy(seen_urls if seen_urls is not None else set()), sources or {})
    msg = response.choices[0].message if response.choices else None
    for i, block in enumerate(msg.content if msg is not None else ()):  # by kind (exact type)
        if type(block) is Text:
            mapper.text(i, block)
        elif type(block) is Thinking:
            mapper.thinking(i, block)
        elif type(block) is ToolUse:
            mapper.tool_use(i, block)
        elif type(block) is Refusal:
            mapper.refusal(i, block)
        elif type(block) is Media:
            mapper.media(i, block)
        else:
            mapper.other(i, block)
    return mapper.draft(response, max_parts)


class _PartsMapper:
    """The parts of one response, its content blocks mapped one by one in order (one
    method per kind of block), and what they hold: calls pending approval, calls to
    run, calls answered here, and the diagnostics of the way."""

    __slots__ = ("provider", "model", "needs_approval", "ids", "cited", "sources",
                 "parts", "pending", "runnable", "answered", "diags")

    def __init__(self, provider: str, model: str, needs_approval: Callable[[str], bool], ids: CallIds,
                 cited: SourcePolicy, sources: Mapping[str, str]) -> None:
        self.provider, self.model, self.needs_approval = provider, model, needs_approval
        self.ids, self.cited, self.sources = ids, cited, sources
        self.parts: list[Part] = []
        self.pending: list[ToolCallPart] = []
        self.runnable: list[ToolCallPart] = []
        self.answered: list[ToolCallPart] = []
        self.diags: list[Diagnostic] = []

    def _tag(self, pd: ProviderData | None) -> ProviderData:
        provider, model = self.provider, self.model
        if pd is None:
            return ProviderData(provider, model, {})
        if pd.provider == provider and pd.model != model:
            return ProviderData(provider, model, pd.data)
        return pd

    def _pd_string(self, i: int, pd: ProviderData | None, **kw: object) -> str | None:
        s = encode_provider_data(self._tag(pd), **kw)  # type: ignore[arg-type]
        if utf8_len(s) > MAX_PROVIDER_DATA_BYTES:
            self.diags.append(Diagnostic(f"content[{i}].provider_data", _UNSUPPORTED,
                                         f"provider data larger than {MAX_PROVIDER_DATA_BYTES} bytes; not kept"))
            return None
        return s

    def thinking(self, i: int, th: Thinking) -> None:
        text = th.text
        summary = False
        if not text and th.summary:
            text = "\n\n".join(c.text for c in th.summary if type(c) is Text)
            summary = bool(text)
        pds = None
        if th.provider_data is not None or th.signature is not None or th.redacted or summary:  # opaque state
            pds = self._pd_string(i, th.provider_data, signature=th.signature, redacted=th.redacted, summary=summary)
        if not text and pds is None:
            return
        for k, chunk in enumerate(split_text(text) if text else [""]):
            self.parts.append(ReasoningPart(text=chunk or None, provider_data=pds if k == 0 else None))

    def text(self, i: int, block: Text) -> None:
        if self._text(i, block.text, block.provider_data):
            for a in block.annotations or []:
                sp = self.cited.part(a)
                if sp is not None:
                    self.parts.append(sp)

    def refusal(self, i: int, block: Refusal) -> None:
        self.diags.append(Diagnostic(f"content[{i}]", _DEGRADED, "refusal written as a text part"))
        self._text(i, block.refusal, None)

    def _text(self, i: int, text: str, pd: ProviderData | None) -> bool:
        """Text parts of ``text`` (False: nothing to keep)."""
        pds = self._pd_string(i, pd) if pd is not None else None
        if not text and pds is None:
            return False
        for k, chunk in enumerate(split_text(text)):
            self.parts.append(TextPart(text=chunk, provider_data=pds if k == 0 else None))
        return True

    def tool_use(self, i: int, tu: ToolUse) -> None:
        cid = self.ids.take(tu.id)
        if cid != tu.id:
            self.diags.append(Diagnostic(f"content[{i}].tool_use.id", _DEGRADED,
                                         "provider call id missing, repeated or unusable; generated one"))
        pds = self._pd_string(i, tu.provider_data) if tu.provider_data else None
        name, refused = self._refused(i, tu)
        src = self.sources.get(name, "")
        if refused is not None:
            args = tu.arguments if utf8_len(tu.arguments) <= MAX_INPUT_BYTES else "{}"
            call = ToolCallPart(call_id=cid, tool=name, input=args, source=src, provider_data=pds)
            self.parts += [call, ToolResultPart(call_id=cid, output=refused, is_error=True)]
            self.answered.append(call)
            return
        wait = self.needs_approval(name)
        call = ToolCallPart(call_id=cid, tool=name, input=tu.arguments, source=src,
                            approval="pending" if wait else None, provider_data=pds)
        self.parts.append(call)
        (self.pending if wait else self.runnable).append(call)

    def _refused(self, i: int, tu: ToolUse) -> tuple[str, str | None]:
        """The call's name to write, and the error result it is answered with at once
        (None: it runs or is asked about)."""
        if not is_tool_name(tu.name):  # never asked about, shown or sent back: answered as unknown
            self.diags.append(Diagnostic(f"content[{i}].tool_use.name", _INVALID,
                                         "not a valid tool name (1-64 of A-Za-z0-9_-); call answered as unknown"))
            return INVALID_TOOL_NAME, invalid_name_output(tu.name)
        if utf8_len(tu.arguments) > MAX_INPUT_BYTES:
            self.diags.append(Diagnostic(f"content[{i}].tool_use.arguments", _INVALID,
                                         "arguments over 200000 bytes; call answered as not run"))
            return tu.name, INPUT_TOO_LARGE
        return tu.name, None

    def media(self, i: int, block: Media) -> None:
        self.diags.append(Diagnostic(f"content[{i}]", _UNSUPPORTED, "this kind of output is not stored in replies",
                                     block.kind))

    def other(self, i: int, block: object) -> None:
        self.diags.append(Diagnostic(f"content[{i}]", _UNSUPPORTED, "a block of a kind replies cannot hold left out",
                                     type(block).__name__))

    def draft(self, response: LuxResponse, max_parts: int) -> ReplyDraft:
        """What the response adds to the reply: at most ``max_parts`` parts (the rest is
        reported), the finish reason and the usage."""
        diags = self.diags
        diags += self.cited.diagnostics()
        if len(self.parts) > max_parts:
            self._drop_over(max_parts)
        finish = map_finish_reason(response.choices[0].finish_reason if response.choices else None)
        if finish is not None and finish not in _KNOWN_FINISH_REASONS:
            diags.append(Diagnostic("finish_reason", _DEGRADED, f"provider finish reason {finish!r} kept as is"))
        return ReplyDraft(
            parts=self.parts,
            finish_reason=finish,
            usage=map_usage(response.usage),
            awaiting_approval=bool(self.pending),
            pending_calls=self.pending,
            runnable_calls=self.runnable,
            answered_calls=self.answered,
            diagnostics=diags,
        )

    def _drop_over(self, max_parts: int) -> None:
        dropped = self.parts[max_parts:]
        self.parts = self.parts[:max_parts]
        drop_ids = {p.call_id for p in dropped if type(p) is ToolCallPart}
        self.pending = [c for c in self.pending if c.call_id not in drop_ids]
        self.runnable = [c for c in self.runnable if c.call_id not in drop_ids]
        self.answered = [c for c in self.answered if c.call_id not in drop_ids]
        self.diags.append(Diagnostic("parts", _INVALID,
                                     f"{len(dropped)} parts over the {MAX_PARTS}-part limit of a reply left out"))


def safe_source_url(url: object) -> str | None:
    """``url`` if a reply may cite it (an app may open it): ``http``/``https`` with a host
    and no ``user@``, at most ``MAX_URL_BYTES``, no whitespace, control or format
    character; else None."""
    if not isinstance(url, str) or len(url) > MAX_URL_BYTES or not _URL_START.match(url):
        return None
    if _URL_UNSAFE.search(url) or utf8_len(url) > MAX_URL_BYTES:
        return None
    return url


def safe_source_title(title: object) -> str | None:
    """A citation's title as one line of plain text: format characters go, controls and
    runs of whitespace become one space, cut to the lexicon's bound (300 graphemes, 3000
    bytes) with an ellipsis; None when nothing is left. Still the provider's words."""
    if not isinstance(title, str):
        return None
    if len(title) > 4 * MAX_TITLE_BYTES:
        title = title[: 4 * MAX_TITLE_BYTES]  # more than the bound can keep: no need to scan it all
    title = _TITLE_SPACES.sub(" ", _TITLE_FORMATS.sub("", title)).strip()
    if utf8_len(title) > MAX_TITLE_BYTES or grapheme_len(title) > MAX_TITLE_GRAPHEMES:
        title = _cut_title(title)
    return title or None


@dataclass(slots=True)
class SourcePolicy:
    """Which cited pages a reply keeps: each url once, at most ``MAX_SOURCES``, only safe
    urls (``safe_source_url``). ``urls`` is shared by the steps of one reply; the counts of
    what was left out are this response's (reported as diagnostics, never the urls)."""

    urls: set[str]
    unsafe: int = 0
    over_cap: int = 0

    def part(self, a: object) -> SourcePart | None:
        """The sourcePart of annotation ``a``, if it is a url annotation to keep."""
        if getattr(a, "kind", None) not in ("url", "web_search_citation"):
            return None
        ref = getattr(a, "ref", None)
        if not ref or ref in self.urls:
            return None
        if len(self.urls) >= MAX_SOURCES:
            self.over_cap += 1
            return None
        url = safe_source_url(ref)
        if url is None:
            self.unsafe += 1
            return None
        try:
            sp = SourcePart(url=url, title=safe_source_title(getattr(a, "text", None)))
        except Exception:  # noqa: BLE001 - not a URI after all: left out like the others
            self.unsafe += 1
            return None
        self.urls.add(url)
        return sp

    def diagnostics(self) -> list[Diagnostic]:
        out = []
        if self.unsafe:
            out.append(Diagnostic("content.annotations", _INVALID,
                                  f"{self.unsafe} citation(s) left out: not an http(s) URL, longer than "
                                  f"{MAX_URL_BYTES} bytes, or with spaces or control characters"))
        if self.over_cap:
            out.append(Diagnostic("content.annotations", _UNSUPPORTED,
                                  f"{self.over_cap} citation(s) over the {MAX_SOURCES} of a reply left out"))
        return out


def _cut_title(title: str) -> str:
    import regex

    clusters = regex.findall(r"\X", title[: 4 * MAX_TITLE_BYTES])[: MAX_TITLE_GRAPHEMES - 1]
    out = ""
    for c in clusters:
        if utf8_len(out + c) > MAX_TITLE_BYTES - 3:
            break
        out += c
    return out + "…"


def with_results(parts: Sequence[Part], results: Mapping[str, ToolResultPart]) -> list[Part]:
    """``parts`` with each result placed right after its call (§5 order). Calls that
    already have a result, and results for unknown calls, are left as they are."""
    have = {p.call_id for p in parts if type(p) is ToolResultPart}
    out: list[Part] = []
    for p in parts:
        out.append(p)
        if type(p) is ToolCallPart and p.call_id not in have:
            r = results.get(p.call_id)
            if r is not None:
                out.append(r)
                have.add(p.call_id)
    return out


def call_ids_in(parts: Sequence[Part]) -> set[str]:
    """Every call id in ``parts`` (to seed ``used_call_ids`` from the history)."""
    return {p.call_id for p in parts if type(p) is ToolCallPart}
