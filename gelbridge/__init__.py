"""gelbridge: an AI assistant for end-to-end encrypted chat records in an atproto repo.

The public API is what ``__all__`` names (``docs/library.md`` teaches it; a test pins
it): embedding the bridge in a firehose or Jetstream consumer, one account's worker, the
model client, their configuration and errors, and the chat app's side for talking to a
bot from code; plus the Lux IR types in ``gelbridge.lux``. Every other module is private
(its name, or its package's, starts with ``_``) and may change between releases. Names load lazily: ``import gelbridge``
stays light for the CLI.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name → the module that defines it
_EXPORTS = {
    "Bridge": "gelbridge._bridge",
    "BridgeOverloaded": "gelbridge._bridge",
    "BridgeClosed": "gelbridge._bridge",
    "AccountMixup": "gelbridge._bridge",
    "IncomingRecord": "gelbridge._ingest",
    "RecordFilter": "gelbridge._ingest",
    "JetstreamSource": "gelbridge._jetstream",
    "subscribe_url": "gelbridge._jetstream",
    "rewound": "gelbridge._jetstream",
    "Settings": "gelbridge._config",
    "load_config": "gelbridge._config",
    "GelbridgeError": "gelbridge._errors",
    "ConfigError": "gelbridge._errors",
    "FirehoseError": "gelbridge._errors",
    "ChatClient": "gelbridge._chat_client",
    "Keyring": "gelbridge._sealing",
    "Worker": "gelbridge._worker",
    "EventOutcome": "gelbridge._worker.decide",
    "ReplyStatus": "gelbridge._records.constants",
    "ModelClient": "gelbridge._adapters.client",
    "ModelResult": "gelbridge._adapters.client",
    "ModelTiming": "gelbridge._adapters.client",
    "ProviderError": "gelbridge._errors",
    "AdapterError": "gelbridge._errors",
}

__all__ = [
    "AccountMixup", "AdapterError", "Bridge", "BridgeClosed", "BridgeOverloaded", "ChatClient", "ConfigError",
    "EventOutcome", "FirehoseError", "GelbridgeError", "IncomingRecord", "JetstreamSource", "Keyring", "ModelClient",
    "ModelResult", "ModelTiming", "ProviderError", "RecordFilter", "ReplyStatus", "Settings", "Worker", "load_config",
    "rewound", "subscribe_url", "__version__",
]
assert sorted(_EXPORTS) + ["__version__"] == __all__

if TYPE_CHECKING:
    from gelbridge._adapters.client import ModelClient, ModelResult, ModelTiming
    from gelbridge._bridge import AccountMixup, Bridge, BridgeClosed, BridgeOverloaded
    from gelbridge._chat_client import ChatClient
    from gelbridge._config import Settings, load_config
    from gelbridge._errors import AdapterError, ConfigError, FirehoseError, GelbridgeError, ProviderError
    from gelbridge._ingest import IncomingRecord, RecordFilter
    from gelbridge._jetstream import JetstreamSource, rewound, subscribe_url
    from gelbridge._records.constants import ReplyStatus
    from gelbridge._sealing import Keyring
    from gelbridge._worker import Worker
    from gelbridge._worker.decide import EventOutcome


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gelbridge' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
