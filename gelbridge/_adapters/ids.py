"""Tool-call ids in the form a provider accepts (pure).

Call ids reach the adapters as written in the records (``docs/protocol-decisions.md``:
unique in the conversation, never regenerated). Providers restrict them: Anthropic
``^[a-zA-Z0-9_-]+$``, OpenAI Responses at most 64 characters, Mistral exactly 9
alphanumerics. An adapter declares its rule (``adapter.tool_call_id``) and the host
rewrites ids with one deterministic map per request, applied alike to a call
(``tool_use.id``) and its result (``tool_result.tool_use_id``), so they stay paired.

Mapping: an id that already fits the rule is kept. Otherwise the id is cleaned
(characters outside ``A-Za-z0-9_-`` become ``_``), cut, and given a short hash suffix
of the ORIGINAL id (``<clean>_<8 hex>``), so distinct ids stay distinct and the same id
maps the same way on every turn. With ``exact_length`` the id is the first N base-62
characters of the hash. Ids are not mapped back: the ids a provider returns are
written as they are (and already fit its rule on the next turn).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any

from gelbridge._errors import AdapterLoadError
from gelbridge.lux import LuxRequest, Message, ToolResult, ToolUse

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SUFFIX_HEX = 8
_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    """The compiled rule pattern (a few per process; ``re.search`` would look it up in
    ``re``'s cache on every id)."""
    got = _PATTERNS.get(pattern)
    if got is None:
        got = _PATTERNS[pattern] = re.compile(pattern)
    return got


@dataclass(frozen=True, slots=True)
class ToolCallIdRule:
    """What ids a provider accepts: a regex, a maximum length, or an exact length
    (exact-length ids are alphanumeric, as Mistral wants)."""

    pattern: str | None = None
    max_length: int | None = None
    exact_length: int | None = None

    def accepts(self, cid: str) -> bool:
        if not cid:
            return False
        if self.exact_length is not None and (len(cid) != self.exact_length or not cid.isascii()
                                              or not cid.isalnum()):
            return False
        if self.max_length is not None and len(cid) > self.max_length:
            return False
        if self.pattern is not None and _compiled(self.pattern).search(cid) is None:
            return False
        return True

    @classmethod
    def from_script(cls, value: Any, where: str) -> ToolCallIdRule | None:
        """Read ``adapter.tool_call_id`` (a table); raise ``AdapterLoadError`` when malformed."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise AdapterLoadError(f"{where}: adapter.tool_call_id must be a table "
                                   "{pattern=..., max_length=..., exact_length=...}")
        unknown = set(value) - {"pattern", "max_length", "exact_length"}
        if unknown:
            raise AdapterLoadError(f"{where}: adapter.tool_call_id has unknown keys {sorted(unknown)}")
        pattern = value.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise AdapterLoadError(f"{where}: adapter.tool_call_id.pattern must be a string")
            try:
                re.compile(pattern)
            except re.error as e:
                raise AdapterLoadError(f"{where}: adapter.tool_call_id.pattern is not a valid "
                                       f"regular expression ({e})") from None
        ints = {}
        for key in ("max_length", "exact_length"):
            v = value.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1024):
                raise AdapterLoadError(f"{where}: adapter.tool_call_id.{key} must be an integer 1..1024")
            ints[key] = v
        if ints["exact_length"] is not None and ints["exact_length"] > 40:
            raise AdapterLoadError(f"{where}: adapter.tool_call_id.exact_length must be at most 40")
        if ints["max_length"] is not None and ints["max_length"] < 12 and ints["exact_length"] is None:
            raise AdapterLoadError(f"{where}: adapter.tool_call_id.max_length below 12 leaves no room for "
                                   "a unique id; use exact_length instead")
        return cls(pattern, ints["max_length"], ints["exact_length"])


def _b62(digest: bytes, n: int) -> str:
    num = int.from_bytes(digest, "big")
    out = []
    for _ in range(n):
        num, r = divmod(num, 62)
        out.append(_B62[r])
    return "".join(out)


class ToolCallIdMap:
    """One request's id map (call and result share it). ``map(id)`` is deterministic
    for a given rule and id; the map is injective within the request."""

    __slots__ = ("rule", "_map", "_taken")

    def __init__(self, rule: ToolCallIdRule | None) -> None:
        self.rule = rule
        self._map: dict[str, str] = {}
        self._taken: dict[str, str] = {}  # new id -> original

    def __len__(self) -> int:
        return sum(1 for k, v in self._map.items() if k != v)

    @property
    def changed(self) -> dict[str, str]:
        """original → new, for the ids that were rewritten."""
        return {k: v for k, v in self._map.items() if k != v}

    def map(self, cid: str) -> str:
        got = self._map.get(cid)
        if got is not None:
            return got
        rule = self.rule
        if rule is None:
            return cid
        new = cid if rule.accepts(cid) and cid not in self._taken else None
        salt = 0
        while new is None or new in self._taken:
            new = self._rewrite(cid, salt)
            salt += 1
            if salt > 1000:  # pragma: no cover - a 1000-fold hash collision
                raise AdapterLoadError("cannot map tool-call ids to the adapter's tool_call_id rule")
        self._map[cid] = new
        self._taken[new] = cid
        return new

    def _rewrite(self, cid: str, salt: int) -> str:
        rule = self.rule
        assert rule is not None
        digest = hashlib.sha256(f"{salt}:{cid}".encode("utf-8", "surrogatepass")).digest()
        if rule.exact_length is not None:
            return _b62(digest, rule.exact_length)
        suffix = digest.hex()[:_SUFFIX_HEX]
        clean = _UNSAFE.sub("_", cid)
        limit = rule.max_length if rule.max_length is not None else 64
        room = max(0, limit - len(suffix) - 1)
        base = clean[:room] or "call"
        base = base[:room] if room else ""
        new = f"{base}_{suffix}" if base else suffix[:limit]
        if rule.pattern is not None and re.search(rule.pattern, new) is None:
            new = ("call_" + digest.hex())[:limit]
            if re.search(rule.pattern, new) is None:
                new = _b62(digest, min(limit, 16))
        return new


def map_tool_call_ids(request: LuxRequest, ids: ToolCallIdMap) -> LuxRequest:
    """A copy of ``request`` with every call id and result id mapped (same map for both).

    The input is not modified; with no rule, or nothing to change, it is returned as is.
    """
    if ids.rule is None:
        return request
    changed = False
    conversation = []
    for item in request.conversation:
        if type(item) is Message:
            content = []
            touched = False
            for b in item.content:
                if type(b) is ToolUse:
                    new = ids.map(b.id)
                    if new != b.id:
                        b = replace(b, id=new)
                        touched = True
                elif type(b) is ToolResult:
                    new = ids.map(b.tool_use_id)
                    if new != b.tool_use_id:
                        b = replace(b, tool_use_id=new)
                        touched = True
                content.append(b)
            if touched:
                item = replace(item, content=content)
                changed = True
        conversation.append(item)
    return replace(request, conversation=conversation) if changed else request


__all__ = ["ToolCallIdMap", "ToolCallIdRule", "map_tool_call_ids"]
