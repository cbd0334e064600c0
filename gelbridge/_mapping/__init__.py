"""Records ⇄ Lux IR for one turn (pure): model/tools/effort choice, thread → request,
response → reply parts, approval adapters. See docs/protocol-decisions.md."""

from gelbridge._mapping.approval import (
    approval_answers,
    repeated_call_parts,
    waiting_call_parts,
    waiting_calls,
)
from gelbridge._mapping.cache import OpenedRecordCache
from gelbridge._mapping.choice import TurnChoice, choose_turn
from gelbridge._mapping.provider_data import (
    DecodedProviderData,
    decode_provider_data,
    encode_provider_data,
)
from gelbridge._mapping.to_lux import OpenedMessage, build_request, prompt_cache_key
from gelbridge._mapping.to_parts import (
    CallIds,
    ReplyDraft,
    call_ids_in,
    map_finish_reason,
    map_usage,
    response_to_parts,
    split_text,
    with_results,
)

__all__ = [
    "CallIds", "DecodedProviderData", "OpenedMessage", "OpenedRecordCache", "ReplyDraft",
    "TurnChoice", "approval_answers", "build_request", "call_ids_in", "choose_turn", "prompt_cache_key",
    "decode_provider_data", "encode_provider_data", "map_finish_reason", "map_usage",
    "repeated_call_parts", "response_to_parts", "split_text", "waiting_call_parts",
    "waiting_calls", "with_results",
]
