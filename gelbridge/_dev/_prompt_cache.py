"""The providers' documented prompt-caching rules, applied to what the local server saw.

So that tests and ``scripts/bench_cache.py`` can tell how much of a conversation's input
a provider would bill as cache reads. Token counts are the server's usual estimate (four
characters a token) over each prompt block's JSON.

- **Anthropic** (docs "Prompt caching"): only prefixes ending at a ``cache_control``
  breakpoint are cached (tools, then system, then messages; at most 4 breakpoints), and
  only from the model's minimum (1,024 tokens; 2,048 for Haiku); a request reads the
  longest cached prefix found at one of its breakpoints or up to 20 blocks before it;
  entries live 5 minutes from their last use. Usage: ``cache_read_input_tokens``,
  ``cache_creation_input_tokens`` (what the last breakpoint adds), ``input_tokens``
  (the rest).
- **OpenAI** (docs "Prompt caching"): automatic for prompts of 1,024 tokens or more; the
  longest prefix seen before on the same route (model and ``prompt_cache_key``; behind
  OpenRouter, its sticky-routing ``session_id``) is served from the cache, in steps of
  128 tokens; ``cached_tokens`` in the usage.
- **Gemini** (docs "Context caching", implicit caching): automatic from 1,024 tokens
  (Flash; 2,048 for Pro), by prefix; ``cachedContentTokenCount`` in the usage.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gelbridge._dev._wire_common import estimate_tokens

ANTHROPIC_TTL = 300.0
ANTHROPIC_LOOKBACK = 20
OPENAI_MIN, OPENAI_STEP = 1024, 128
MAX_ROUTES = 4096


@dataclass(frozen=True)
class CacheUse:
    """What one request's prompt cost: all of it, and the parts read from and written to the cache."""

    prompt_tokens: int
    read: int = 0
    written: int = 0


def _strip(block: Any) -> Any:
    if isinstance(block, Mapping) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _chain(blocks: Sequence[Any], salt: str) -> tuple[list[str], list[int]]:
    """Prefix hashes and cumulative token counts, one per block."""
    h = hashlib.sha256(salt.encode())
    hashes, cum, total = [], [], 0
    for b in blocks:
        text = json.dumps(_strip(b), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        h.update(text.encode())
        hashes.append(h.copy().hexdigest())
        total += estimate_tokens(text)
        cum.append(total)
    return hashes, cum


def anthropic_blocks(body: Mapping[str, Any]) -> list[Any]:
    blocks: list[Any] = list(body.get("tools") or [])
    system = body.get("system")
    blocks += system if isinstance(system, list) else ([{"type": "text", "text": system}] if system else [])
    for m in body.get("messages") or []:
        if isinstance(m, Mapping):
            content = m.get("content")
            items = content if isinstance(content, list) else [{"type": "text", "text": content}]
            blocks += [{"role": m.get("role"), **b} if isinstance(b, Mapping) else b for b in items]
    return blocks


def openai_blocks(body: Mapping[str, Any]) -> list[Any]:
    """Chat Completions (tools, messages) and Responses (tools, instructions, input)."""
    blocks: list[Any] = list(body.get("tools") or [])
    if body.get("instructions"):
        blocks.append({"instructions": body["instructions"]})
    items = body.get("messages") or body.get("input") or []
    return blocks + (list(items) if isinstance(items, list) else [{"input": items}])


def gemini_blocks(body: Mapping[str, Any]) -> list[Any]:
    blocks: list[Any] = []
    for key in ("systemInstruction", "system_instruction", "tools"):
        if body.get(key):
            blocks.append({key: body[key]})
    return blocks + list(body.get("contents") or [])


class PromptCache:
    """Per server: what each provider would have in its prompt cache (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._anthropic: dict[str, float] = {}  # prefix hash -> expiry (monotonic seconds)
        self._routes: dict[str, list[tuple[list[str], list[int]]]] = {}  # route -> earlier prompts

    def anthropic(self, body: Mapping[str, Any], now: float) -> CacheUse | None:
        """None when the prompt is under the model's minimum (nothing is cached)."""
        blocks = anthropic_blocks(body)
        model = str(body.get("model", ""))
        hashes, cum = _chain(blocks, "anthropic\n" + model)
        minimum = 2048 if "haiku" in model else 1024
        if not cum or cum[-1] < minimum:
            return None
        points = [i for i, b in enumerate(blocks) if isinstance(b, Mapping) and b.get("cache_control")][:4]
        with self._lock:
            live = {h for h, until in self._anthropic.items() if until > now}
            read_at = -1
            for p in points:
                for j in range(p, max(-1, p - ANTHROPIC_LOOKBACK - 1), -1):
                    if hashes[j] in live:
                        read_at = max(read_at, j)
                        break
            read = cum[read_at] if read_at >= 0 else 0
            written = 0
            if points and points[-1] > read_at and cum[points[-1]] >= minimum:
                written = cum[points[-1]] - read
            for p in points:
                if cum[p] >= minimum:
                    self._anthropic[hashes[p]] = now + ANTHROPIC_TTL
            if read_at >= 0:
                self._anthropic[hashes[read_at]] = now + ANTHROPIC_TTL
        return CacheUse(cum[-1], read, written)

    def prefix(self, route: str, blocks: Sequence[Any], *, minimum: int, step: int = 1) -> CacheUse | None:
        """Automatic prefix caching (OpenAI, Gemini): the longest prefix an earlier
        request on the same route shared, in ``step``-token units, from ``minimum``."""
        hashes, cum = _chain(blocks, route)
        if not cum or cum[-1] < minimum:
            return None
        with self._lock:
            seen = self._routes.setdefault(route, [])
            shared = 0
            for old_hashes, old_cum in seen:
                n = 0
                for a, b in zip(old_hashes, hashes):
                    if a != b:
                        break
                    n += 1
                if n:
                    shared = max(shared, min(old_cum[n - 1], cum[n - 1]))
            seen.append((hashes, cum))
            del seen[:-8]
            if len(self._routes) > MAX_ROUTES:
                self._routes.pop(next(iter(self._routes)))
        cached = (shared // step) * step if shared >= minimum else 0
        return CacheUse(cum[-1], min(cached, cum[-1]))

    def openai(self, body: Mapping[str, Any]) -> CacheUse | None:
        key = body.get("prompt_cache_key") or body.get("session_id") or ""
        route = f"openai\n{body.get('model', '')}\n{key}"
        return self.prefix(route, openai_blocks(body), minimum=OPENAI_MIN, step=OPENAI_STEP)

    def gemini(self, model: str, body: Mapping[str, Any]) -> CacheUse | None:
        return self.prefix(f"gemini\n{model}", gemini_blocks(body), minimum=2048 if "pro" in model else 1024)
