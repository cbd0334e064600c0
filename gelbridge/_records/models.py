"""Typed models of the chat.gel.assistant lexicons (``lexicons/chat/gel/assistant``).

The models enforce every lexicon constraint (tests/records/test_lexicon_agreement.py
walks the lexicon files and proves it):

- string ``maxLength`` counts UTF-8 bytes and ``maxGraphemes`` counts extended
  grapheme clusters, as the atproto lexicon spec says;
- ``knownValues`` are open: an unknown ``role`` or ``status`` is kept, not rejected;
- unions are open too: a part whose ``$type`` gelbridge does not know is kept as an
  :class:`UnknownPart` and written back unchanged. A ``content``/``instructions``
  union member gelbridge does not know is a :class:`RecordError` (nothing to answer);
- fields gelbridge does not model are kept (``model_extra``) and written back.

Read with ``Model.from_value(value)`` (atproto JSON form or CBOR form), write with
``model.to_value()`` (atproto JSON form, ``$type`` set, unset optional fields left out).
Python attribute names are snake_case; the wire names are camelCase.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self

import orjson
import regex
from annotated_types import Ge, Le, MaxLen
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, core_schema

from gelbridge._errors import RecordError
from gelbridge._records.codec import bytes_json, bytes_validator, cbor_size, decode_link, to_json_form
from gelbridge._records.constants import (
    BRIDGE_COLLECTION,
    CONVERSATION_COLLECTION,
    ENCRYPTED_CONTENT_TYPE,
    KEY_GRANT_COLLECTION,
    MAX_RECORD_BYTES,
    MESSAGE_COLLECTION,
    PLAIN_CONTENT_TYPE,
    SETTINGS_COLLECTION,
    defs_type,
)
from gelbridge._records.nesting import check_value, may_exceed
from gelbridge._records.text import check_fields

# --- constrained scalar types ----------------------------------------------------------

_GRAPHEME = regex.compile(r"\X")


def utf8_len(s: str) -> int:
    """Length of ``s`` in UTF-8 bytes (lexicon ``maxLength`` unit for strings)."""
    return len(s) if s.isascii() else len(s.encode("utf-8"))


def grapheme_len(s: str) -> int:
    """Number of extended grapheme clusters in ``s`` (lexicon ``maxGraphemes`` unit)."""
    return sum(1 for _ in _GRAPHEME.finditer(s))


def _string_check(max_bytes: int | None, max_graphemes: int | None) -> Any:
    def check(s: str) -> str:
        n = len(s)
        if max_bytes is not None and n * 4 > max_bytes:
            if n > max_bytes:
                raise ValueError(f"longer than {max_bytes} UTF-8 bytes")
            try:
                if utf8_len(s) > max_bytes:
                    raise ValueError(f"longer than {max_bytes} UTF-8 bytes")
            except UnicodeEncodeError:
                raise ValueError("not valid UTF-8 (lone surrogate)") from None
        if max_graphemes is not None and n > max_graphemes and grapheme_len(s) > max_graphemes:
            raise ValueError(f"longer than {max_graphemes} graphemes")
        return s

    return check


class _LexStrSchema:
    """Core schema of a limited string: a native fast path, the exact check behind it.

    A string of at most ``max_bytes // 4`` code points has at most ``max_bytes`` UTF-8
    bytes, and one of at most ``max_graphemes`` code points at most that many graphemes,
    so pydantic-core accepts such strings without calling Python (short strings are
    nearly all of them); longer ones go through the exact check.
    """

    def __init__(self, max_bytes: int | None, max_graphemes: int | None) -> None:
        self.max_bytes, self.max_graphemes = max_bytes, max_graphemes

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        mb, mg = self.max_bytes, self.max_graphemes
        fast = min(x for x in (mb // 4 if mb is not None else None, mg) if x is not None)
        limits = " and ".join(
            x for x in (f"{mb} UTF-8 bytes" if mb is not None else "", f"{mg} graphemes" if mg is not None else "") if x
        )
        return core_schema.union_schema(
            [
                core_schema.str_schema(max_length=fast, strict=True),
                core_schema.no_info_after_validator_function(
                    _string_check(mb, mg), core_schema.str_schema(strict=True)
                ),
            ],
            mode="left_to_right",
            custom_error_type="lex_string",
            custom_error_message=f"must be a valid UTF-8 string of at most {limits}",
        )


# An atproto datetime as one anchored regex, run natively by pydantic-core (no Python
# call): RFC 3339 with a timezone (not "-00:00"), and only real calendar dates/times
# (year 0001-9999, day within its month, 29 February in leap years only, hours 00-23,
# minutes and seconds 00-59). tests/records/test_native_checks.py proves it accepts exactly
# what the earlier regex + ``datetime.fromisoformat`` check accepted.
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
    rf"|(?:0[13578]|1[02])-31)|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,20})?"
_ZONE = r"(?:Z|\+[0-2][0-9]:[0-5][0-9]|-(?:(?:0[1-9]|[12][0-9]):[0-5][0-9]|00:(?:0[1-9]|[1-5][0-9])))"
DATETIME_PATTERN = rf"^{_DATE}T{_TIME}{_ZONE}$"
"""The pattern every ``datetime`` field must match (Rust regex syntax; also valid ``re``)."""


class _DatetimeSchema:
    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.custom_error_schema(
            core_schema.str_schema(pattern=DATETIME_PATTERN, strict=True),
            custom_error_type="datetime",
            custom_error_message=(
                "not an atproto datetime (RFC 3339 with timezone and a real calendar date/time,"
                " e.g. 2025-01-31T12:00:00.000Z)"
            ),
        )


_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]+")


def _check_uri(s: str) -> str:
    if len(s) > 8192 or not _URI_RE.fullmatch(s):
        raise ValueError("not a URI (scheme:rest, no whitespace, at most 8 KB)")
    return s


#: ``_URI_RE`` for pydantic-core's Rust regex: ``\s`` spelled out as the characters
#: Python's ``re`` counts as whitespace (Unicode's White_Space differs on a few).
_PY_WHITESPACE = "".join(f"\\x{{{c:x}}}" for c in (
    0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
    0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
))
URI_PATTERN = rf"^[A-Za-z][A-Za-z0-9+.-]*:[^{_PY_WHITESPACE}]+$"


class _UriSchema:
    """A URI: the pattern natively, and only what it rejects through ``_check_uri``
    (same verdict; the Python check also decides strings Rust cannot read)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.union_schema(
            [
                core_schema.str_schema(pattern=URI_PATTERN, max_length=8192, strict=True),
                core_schema.no_info_after_validator_function(_check_uri, core_schema.str_schema(strict=True)),
            ],
            mode="left_to_right",
            custom_error_type="uri",
            custom_error_message="not a URI (scheme:rest, no whitespace, at most 8 KB)",
        )


Datetime = Annotated[str, _DatetimeSchema()]
"""An atproto ``datetime`` string, kept as written so records round-trip byte for byte."""

Uri = Annotated[str, _UriSchema()]


class _LexBytesSchema:
    """Core schema of a bytes field: one Python call decodes, type-checks and limits it."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            bytes_validator(self.max_length),
            serialization=core_schema.plain_serializer_function_ser_schema(bytes_json),
        )


CidLink = Annotated[str, BeforeValidator(decode_link), PlainSerializer(lambda c: {"$link": c})]
"""A CID link, held as its string form; written as ``{"$link": cid}``."""

NonNegInt = Annotated[int, Ge(0)]


def now_datetime() -> str:
    """The current time as an atproto datetime string (UTC, milliseconds, ``Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- errors -------------------------------------------------------------------------------


def _loc_str(loc: tuple[Any, ...]) -> str:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif "#" in p or p in (_UNKNOWN_BRANCH, "blob") or p.startswith("function-"):
            continue
        else:
            out += f".{p}" if out else p
    return out or "(top level)"


#: How the two native tagged unions (``Content``, ``Part``) report, for record_error.
_KNOWN_BRANCH = "#known"  # union label of the known-parts branch of a Part
_UNKNOWN_BRANCH = "unknown"  # union label of its UnknownPart branch
_PART_TAG_ERROR = "missing_type"
_PART_TAG_MESSAGE = "a part needs a $type string"
_NOT_UNKNOWN_ERROR = "not_unknown_part"  # the UnknownPart branch does not apply
_CONTENT_TAG_MESSAGE = f"$type must be {ENCRYPTED_CONTENT_TYPE} or {PLAIN_CONTENT_TYPE}"


def _relevant_errors(errs: list[Any]) -> list[Any]:
    """The errors that say what is wrong, out of pydantic-core's raw list.

    A part that fails is reported by both union branches: keep the known-part errors
    unless only the UnknownPart branch applied (an unknown ``$type`` that is itself
    bad). A non-object where a tagged union expects one gets the union's own message.
    """
    out = []
    unknown_prefixes = {
        tuple(e["loc"][: e["loc"].index(_UNKNOWN_BRANCH)])
        for e in errs
        if e["type"] != _NOT_UNKNOWN_ERROR and _UNKNOWN_BRANCH in e["loc"]
    }
    for e in errs:
        if e["type"] == _NOT_UNKNOWN_ERROR:
            continue
        loc = e["loc"]
        at_part_tag = bool(loc) and loc[-1] == _KNOWN_BRANCH
        if at_part_tag and tuple(loc[:-1]) in unknown_prefixes:
            continue
        if e["type"] == "model_attributes_type":  # only the tagged unions look up attributes
            e = {**e, "msg": _PART_TAG_MESSAGE if at_part_tag else _CONTENT_TAG_MESSAGE}
        out.append(e)
    return out or errs


def record_error(e: ValidationError, what: str) -> RecordError:
    """A RecordError naming the first bad field; never includes field values."""
    errs = _relevant_errors(e.errors(include_url=False, include_input=False, include_context=False))
    first = errs[0]
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})" if len(errs) > 1 else ""
    return RecordError(f"{what}: field {_loc_str(first['loc'])}: {msg}{more}")


# --- base -----------------------------------------------------------------------------------


def _extra_json_form(v: Any) -> Any:
    return to_json_form(v) if isinstance(v, (dict, list, bytes)) else v


_ExtraValue = Annotated[Any, BeforeValidator(_extra_json_form)]


class LexObject(BaseModel):
    """Base of every lexicon object: strict types, camelCase wire names, extras kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        strict=True,
        extra="allow",
        frozen=True,
        hide_input_in_errors=True,  # a validation error's text may reach a log: never the (sealed) value
    )

    #: The lexicon type this model implements (``nsid`` or ``nsid#name``).
    LEXICON_TYPE: ClassVar[str] = ""

    #: Fields gelbridge does not model, kept in JSON form. A typed extras dict runs the
    #: conversion only when a value has extras (a model validator would run on every
    #: object, ~0.3 µs each).
    __pydantic_extra__: dict[str, _ExtraValue] = Field(init=False)

    @classmethod
    def from_value(cls, value: Any, *, uri: str | None = None) -> Self:
        """Validate a decoded value (atproto JSON or CBOR form); RecordError if invalid."""
        if not isinstance(value, dict):
            what = f"record {uri}" if uri else f"{cls.LEXICON_TYPE or cls.__name__} value"
            raise RecordError(f"{what}: expected an object, got {type(value).__name__}")
        try:
            # the compiled validator directly: ``model_validate`` adds ~1 µs per call
            model: Self = cls.__pydantic_validator__.validate_python(value, by_alias=True, by_name=False)
            return model
        except ValidationError as e:
            what = f"record {uri}" if uri else f"{cls.LEXICON_TYPE or cls.__name__} value"
            raise record_error(e, what) from None

    def to_value(self) -> dict[str, Any]:
        """The atproto JSON form, ``$type`` included, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


def _type_field(t: str) -> Any:
    return Field(t, alias="$type")


# --- blobs ------------------------------------------------------------------------------------


class BlobRef(LexObject):
    """A blob reference: ``{"$type": "blob", "ref": {"$link": cid}, "mimeType", "size"}``."""

    LEXICON_TYPE: ClassVar[str] = "blob"

    type: Literal["blob"] = Field(alias="$type")
    ref: CidLink
    mime_type: Annotated[str, _LexStrSchema(256, None)]
    size: NonNegInt

    @classmethod
    def of(cls, ref: str, mime_type: str, size: int) -> BlobRef:
        """Build a blob ref in code (``$type`` filled in)."""
        return cls.model_validate({"$type": "blob", "ref": {"$link": ref}, "mimeType": mime_type, "size": size})


def _blob_limits(accept: tuple[str, ...], max_size: int) -> Any:
    def check(b: BlobRef) -> BlobRef:
        mime = b.mime_type.lower()
        if not any(
            a == "*/*" or a == mime or (a.endswith("/*") and mime.startswith(a[:-1])) for a in accept
        ):
            # never the mimeType itself: it may come from inside a seal, and record
            # errors end up in unsealed replies (error.message)
            raise ValueError(f"blob mimeType not accepted (accepts {', '.join(accept)})")
        if b.size > max_size:
            raise ValueError(f"blob larger than {max_size} bytes")
        return b

    return AfterValidator(check)


# --- defs: small objects ---------------------------------------------------------------------

ProviderDataText = Annotated[str, _LexStrSchema(100_000, None)]  # the opaque providerData string of a part (lux.ProviderData is the IR object)
Effort = str  # knownValues none, low, medium, high, max (open)


class ModelRef(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("modelRef")

    provider: Annotated[str, _LexStrSchema(128, None)]
    id: Annotated[str, _LexStrSchema(256, None)]


class GenerationRequest(LexObject):
    """Present on a user message = "please reply" (reply key ``K.r{attempt}``)."""

    LEXICON_TYPE: ClassVar[str] = defs_type("generationRequest")

    attempt: Annotated[int, Ge(0), Le(1000)] = 0
    effort: Effort | None = None
    model: ModelRef | None = None
    tools: Annotated[list[Annotated[str, _LexStrSchema(128, None)]], MaxLen(64)] | None = None


class Usage(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("usage")

    input_tokens: NonNegInt | None = None
    output_tokens: NonNegInt | None = None
    reasoning_tokens: NonNegInt | None = None


class ReplyError(LexObject):
    """``chat.gel.assistant.message#error``: why a reply failed (never user content)."""

    LEXICON_TYPE: ClassVar[str] = "chat.gel.assistant.message#error"

    kind: str
    message: Annotated[str, _LexStrSchema(3000, None)]


# --- parts --------------------------------------------------------------------------------------


class TextPart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("textPart")

    type: Literal["chat.gel.assistant.defs#textPart"] = _type_field(defs_type("textPart"))
    text: Annotated[str, _LexStrSchema(500_000, None)]
    provider_data: ProviderDataText | None = None


class ReasoningPart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("reasoningPart")

    type: Literal["chat.gel.assistant.defs#reasoningPart"] = _type_field(defs_type("reasoningPart"))
    text: Annotated[str, _LexStrSchema(500_000, None)] | None = None
    provider_data: ProviderDataText | None = None


class ImagePart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("imagePart")

    type: Literal["chat.gel.assistant.defs#imagePart"] = _type_field(defs_type("imagePart"))
    image: Annotated[BlobRef, _blob_limits(("image/png", "image/jpeg", "image/webp", "image/gif"), 20_000_000)]
    alt: Annotated[str, _LexStrSchema(10_000, 1_000)] | None = None


class ExtractedText(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("extractedText")

    text: Annotated[BlobRef, _blob_limits(("text/plain",), 20_000_000)]
    method: str  # knownValues text, ocr (open)


class FilePart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("filePart")

    type: Literal["chat.gel.assistant.defs#filePart"] = _type_field(defs_type("filePart"))
    file: Annotated[BlobRef, _blob_limits(("*/*",), 50_000_000)]
    name: Annotated[str, _LexStrSchema(1024, None)] | None = None
    extracted: ExtractedText | None = None


class ToolCallPart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("toolCallPart")

    type: Literal["chat.gel.assistant.defs#toolCallPart"] = _type_field(defs_type("toolCallPart"))
    call_id: Annotated[str, _LexStrSchema(256, None)]
    tool: Annotated[str, _LexStrSchema(128, None)]
    input: Annotated[str, _LexStrSchema(200_000, None)]
    approval: str | None = None  # knownValues pending, approved, denied (open)
    source: Annotated[str, _LexStrSchema(1024, None)] | None = None
    provider_data: ProviderDataText | None = None


class ToolResultPart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("toolResultPart")

    type: Literal["chat.gel.assistant.defs#toolResultPart"] = _type_field(defs_type("toolResultPart"))
    call_id: Annotated[str, _LexStrSchema(256, None)]
    output: Annotated[str, _LexStrSchema(500_000, None)]
    is_error: bool = False
    output_blob: Annotated[BlobRef, _blob_limits(("*/*",), 50_000_000)] | None = None


class ToolApprovalPart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("toolApprovalPart")

    type: Literal["chat.gel.assistant.defs#toolApprovalPart"] = _type_field(defs_type("toolApprovalPart"))
    call_id: Annotated[str, _LexStrSchema(256, None)]
    approved: bool
    reason: Annotated[str, _LexStrSchema(3000, None)] | None = None


class SourcePart(LexObject):
    LEXICON_TYPE: ClassVar[str] = defs_type("sourcePart")

    type: Literal["chat.gel.assistant.defs#sourcePart"] = _type_field(defs_type("sourcePart"))
    url: Uri
    title: Annotated[str, _LexStrSchema(3000, 300)] | None = None


class UnknownPart(LexObject):
    """A part whose ``$type`` gelbridge does not know: kept whole, written back as is."""

    type: Annotated[str, _LexStrSchema(512, None)] = Field(alias="$type")


KNOWN_PARTS: dict[str, type[LexObject]] = {
    cls.LEXICON_TYPE: cls
    for cls in (
        TextPart,
        ReasoningPart,
        ImagePart,
        FilePart,
        ToolCallPart,
        ToolResultPart,
        ToolApprovalPart,
        SourcePart,
    )
}


def _expose_tag(cls: type[LexObject], tag: str) -> None:
    """Give ``cls`` a class attribute ``$type`` = ``tag``.

    The tagged unions below look the tag up natively under ``$type``: in a dict by key,
    in an object (a model built in code) as an attribute, which this provides.
    """
    setattr(cls, "$type", tag)


def _unknown_candidate(v: Any) -> Any:
    """Let only an UnknownPart, or a dict whose ``$type`` is a non-empty string naming
    no known part, through to the UnknownPart branch (a malformed known part must fail
    as that part, not become an UnknownPart)."""
    if type(v) is dict:
        t = v.get("$type")
        if type(t) is str and t and t not in KNOWN_PARTS:
            return v
    elif isinstance(v, UnknownPart):
        return v
    raise PydanticCustomError(_NOT_UNKNOWN_ERROR, "not an unknown part")


class _PartSchema:
    """Core schema of one part, discriminated natively on ``$type`` (no Python call for
    a known part): the known part models by tag, else (only then) UnknownPart."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        known = core_schema.tagged_union_schema(
            {t: handler.generate_schema(cls) for t, cls in KNOWN_PARTS.items()},
            discriminator="$type",
            custom_error_type=_PART_TAG_ERROR,
            custom_error_message=_PART_TAG_MESSAGE,
            from_attributes=True,
        )
        unknown = core_schema.no_info_before_validator_function(
            _unknown_candidate, handler.generate_schema(UnknownPart)
        )
        return core_schema.union_schema(
            [(known, _KNOWN_BRANCH), (unknown, _UNKNOWN_BRANCH)],
            mode="left_to_right",
            # every part is a model instance: serialize it by its own class (a union
            # serializer would try the choices one by one, ~2 µs per part)
            serialization=core_schema.simple_ser_schema("any"),
        )


for _cls in KNOWN_PARTS.values():
    _expose_tag(_cls, _cls.LEXICON_TYPE)
_expose_tag(UnknownPart, "")  # no tag: an UnknownPart instance takes the UnknownPart branch

Part = Annotated[
    TextPart | ReasoningPart | ImagePart | FilePart | ToolCallPart | ToolResultPart | ToolApprovalPart | SourcePart | UnknownPart,
    _PartSchema(),
]
"""One message part: a known part model, or UnknownPart for any other ``$type``."""


# --- content ----------------------------------------------------------------------------------


class PlainContent(LexObject):
    """The parts of a message in order; this is what an encryptedContent seals."""

    LEXICON_TYPE: ClassVar[str] = PLAIN_CONTENT_TYPE

    type: Literal["chat.gel.assistant.defs#plainContent"] = _type_field(PLAIN_CONTENT_TYPE)
    parts: Annotated[list[Part], MaxLen(1000)]


class EncryptedContent(LexObject):
    """A sealed value (PROTOCOL.md §2). ``nonce``/``ciphertext`` are raw bytes here."""

    LEXICON_TYPE: ClassVar[str] = ENCRYPTED_CONTENT_TYPE

    type: Literal["chat.gel.assistant.defs#encryptedContent"] = _type_field(ENCRYPTED_CONTENT_TYPE)
    scheme: Annotated[str, _LexStrSchema(128, None)]
    key_id: Annotated[str, _LexStrSchema(128, None)]
    nonce: Annotated[bytes, _LexBytesSchema(64)]
    ciphertext: Annotated[bytes, _LexBytesSchema(1_000_000)]
    blobs: Annotated[list[BlobRef], MaxLen(100)] | None = None

    def __repr__(self) -> str:
        return (
            f"EncryptedContent(scheme={self.scheme!r}, key_id={self.key_id!r}, "
            f"nonce=<{len(self.nonce)} bytes>, ciphertext=<{len(self.ciphertext)} bytes>)"
        )

    __str__ = __repr__


class _ContentSchema:
    """Core schema of a content union, discriminated natively on ``$type``."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.tagged_union_schema(
            {cls.LEXICON_TYPE: handler.generate_schema(cls) for cls in (EncryptedContent, PlainContent)},
            discriminator="$type",
            custom_error_type="content_type",
            custom_error_message=_CONTENT_TAG_MESSAGE,
            from_attributes=True,
            serialization=core_schema.simple_ser_schema("any"),  # by the instance's own class
        )


_expose_tag(EncryptedContent, ENCRYPTED_CONTENT_TYPE)
_expose_tag(PlainContent, PLAIN_CONTENT_TYPE)

Content = Annotated[EncryptedContent | PlainContent, _ContentSchema()]
"""Sealed or plain content (a union; ``$type`` required)."""


# --- records -------------------------------------------------------------------------------------

_Tools = Annotated[list[Annotated[str, _LexStrSchema(128, None)]], MaxLen(64)]


#: A value whose compact JSON (raw bytes written as that many blanks) is this short is
#: far below the record limit, so ``cbor_size`` need not run. For every value
#: ``cbor_size(v) <= 4.5 * len(json) + 4.5``: each item is counted with a 9-byte header
#: and takes at least 2 JSON characters with its separator (a string's or bytes' own
#: length counts once on each side; tests/records check the bound).
_SMALL_JSON = MAX_RECORD_BYTES // 5


def _bytes_as_blanks(o: Any) -> Any:
    if isinstance(o, (bytes, bytearray, memoryview)):
        return " " * len(o)
    raise TypeError


_JSON_NUL = b"\\u0000"  # how JSON spells U+0000 (a control character: always escaped)


def _record_size(value: dict[str, Any], what: Callable[[], str] = lambda: "record") -> int:
    """``cbor_size(value)``, skipped (0) for values that are surely small; before it, the
    nesting limit and valid Unicode (``nesting.check_value``), and no NUL outside the
    content (``text.check_fields``): RecordError, unless the compact JSON shows the
    value cannot break them.

    ``orjson.dumps`` is ~10x cheaper than walking the value; it takes the CBOR form too
    (raw bytes stand in as blanks). Anything it cannot write (nested past 255 levels, a
    lone surrogate, an integer beyond 64 bits) takes the exact path.
    """
    try:
        dumped: bytes | None = orjson.dumps(value, default=_bytes_as_blanks)
    except (TypeError, orjson.JSONEncodeError):
        dumped = None
    if dumped is None or may_exceed(dumped):
        check_value(value, what())
    if dumped is None or _JSON_NUL in dumped:
        check_fields(value, what())
    if dumped is not None and len(dumped) <= _SMALL_JSON:
        return 0
    return cbor_size(value)


class _Record(LexObject):
    @classmethod
    def from_value(cls, value: Any, *, uri: str | None = None) -> Self:
        """Validate a record value; also rejects records too large for a repo."""
        if not isinstance(value, dict):
            return super().from_value(value, uri=uri)  # says it is not an object
        t = value.get("$type")
        if t is not None and t != cls.LEXICON_TYPE:
            what = f"record {uri}" if uri else f"{cls.LEXICON_TYPE} record"
            raise RecordError(f"{what}: $type must be {cls.LEXICON_TYPE!r}")
        size = _record_size(value, lambda: f"record {uri}" if uri else f"{cls.LEXICON_TYPE} record")
        if size > MAX_RECORD_BYTES:
            what = f"record {uri}" if uri else f"{cls.LEXICON_TYPE} record"
            raise RecordError(
                f"{what} is too large: about {size} bytes as DAG-CBOR, limit {MAX_RECORD_BYTES};"
                " move large content into blobs"
            )
        try:  # LexObject.from_value, inlined: this runs for every message of a thread
            record: Self = cls.__pydantic_validator__.validate_python(value, by_alias=True, by_name=False)
            return record
        except ValidationError as e:
            raise record_error(e, f"record {uri}" if uri else f"{cls.LEXICON_TYPE} value") from None


class MessageRecord(_Record):
    """``chat.gel.assistant.message``: a user message or an assistant reply."""

    LEXICON_TYPE: ClassVar[str] = MESSAGE_COLLECTION

    type: Literal["chat.gel.assistant.message"] = _type_field(MESSAGE_COLLECTION)
    conversation: Annotated[str, _LexStrSchema(512, None)]
    role: str  # knownValues user, assistant (open)
    parent: Annotated[str, _LexStrSchema(512, None)] | None = None
    content: Content
    generation: GenerationRequest | None = None
    model: ModelRef | None = None
    effort: Effort | None = None
    usage: Usage | None = None
    status: str | None = None
    finish_reason: str | None = None
    error: ReplyError | None = None
    created_at: Datetime
    updated_at: Datetime | None = None

    @property
    def is_sealed(self) -> bool:
        """True if the content is an encryptedContent."""
        return isinstance(self.content, EncryptedContent)


class ConversationRecord(_Record):
    """``chat.gel.assistant.conversation``: optional per-conversation settings."""

    LEXICON_TYPE: ClassVar[str] = CONVERSATION_COLLECTION

    type: Literal["chat.gel.assistant.conversation"] = _type_field(CONVERSATION_COLLECTION)
    created_at: Datetime
    instructions: Content | None = None
    model: ModelRef | None = None
    tools: _Tools | None = None


class SettingsRecord(_Record):
    """``chat.gel.assistant.settings`` (key ``self``): the user's defaults."""

    LEXICON_TYPE: ClassVar[str] = SETTINGS_COLLECTION

    type: Literal["chat.gel.assistant.settings"] = _type_field(SETTINGS_COLLECTION)
    model: ModelRef | None = None
    tools: _Tools | None = None
    effort: Effort | None = None


class _ExactBytesSchema(_LexBytesSchema):
    """A bytes field with a ``minLength`` too (``publicKey``: exactly 32)."""

    def __init__(self, min_length: int, max_length: int) -> None:
        super().__init__(max_length)
        self.min_length = min_length

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        inner, lo = bytes_validator(self.max_length), self.min_length

        def validate(value: Any) -> bytes:
            raw = inner(value)
            if len(raw) < lo:
                raise ValueError(f"Data should have at least {lo} bytes")
            return raw

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.plain_serializer_function_ser_schema(bytes_json))


class BridgeRecord(_Record):
    """``chat.gel.assistant.bridge`` (key: the bridge key's kid): a bridge's public key (§6)."""

    LEXICON_TYPE: ClassVar[str] = BRIDGE_COLLECTION

    type: Literal["chat.gel.assistant.bridge"] = _type_field(BRIDGE_COLLECTION)
    scheme: Annotated[str, _LexStrSchema(64, None)]
    public_key: Annotated[bytes, _ExactBytesSchema(32, 32)]
    name: Annotated[str, _LexStrSchema(64, None)] | None = None
    created_at: Datetime

    def __repr__(self) -> str:
        return f"BridgeRecord(scheme={self.scheme!r}, name={self.name!r})"

    __str__ = __repr__


class KeyGrantRecord(_Record):
    """``chat.gel.assistant.keyGrant`` (key: tid): a conversation key sealed to a bridge key (§6)."""

    LEXICON_TYPE: ClassVar[str] = KEY_GRANT_COLLECTION

    type: Literal["chat.gel.assistant.keyGrant"] = _type_field(KEY_GRANT_COLLECTION)
    scheme: Annotated[str, _LexStrSchema(64, None)]
    recipient: Annotated[str, _LexStrSchema(64, None)]
    key_id: Annotated[str, _LexStrSchema(128, None)]
    sealed_key: Annotated[bytes, _LexBytesSchema(256)]
    created_at: Datetime

    def __repr__(self) -> str:  # never the sealed key
        return f"KeyGrantRecord(recipient={self.recipient!r}, key_id={self.key_id!r})"

    __str__ = __repr__


RecordModel = MessageRecord | ConversationRecord | SettingsRecord | BridgeRecord | KeyGrantRecord

RECORD_MODELS: dict[str, type[_Record]] = {
    MESSAGE_COLLECTION: MessageRecord,
    CONVERSATION_COLLECTION: ConversationRecord,
    SETTINGS_COLLECTION: SettingsRecord,
    BRIDGE_COLLECTION: BridgeRecord,
    KEY_GRANT_COLLECTION: KeyGrantRecord,
}

#: Every lexicon object type → its model (the lexicon agreement test walks this).
MODELS_BY_TYPE: dict[str, type[LexObject]] = {
    **RECORD_MODELS,
    **KNOWN_PARTS,
    ReplyError.LEXICON_TYPE: ReplyError,
    ModelRef.LEXICON_TYPE: ModelRef,
    GenerationRequest.LEXICON_TYPE: GenerationRequest,
    Usage.LEXICON_TYPE: Usage,
    ExtractedText.LEXICON_TYPE: ExtractedText,
    PlainContent.LEXICON_TYPE: PlainContent,
    EncryptedContent.LEXICON_TYPE: EncryptedContent,
}


def parse_record(collection: str, value: Any, *, uri: str | None = None) -> RecordModel:
    """Validate a record of one of the chat.gel.assistant collections."""
    cls = RECORD_MODELS.get(collection)
    if cls is None:
        raise RecordError(f"record {uri or ''}: collection {collection!r} is not a chat.gel.assistant record")
    return cls.from_value(value, uri=uri)  # type: ignore[return-value]
