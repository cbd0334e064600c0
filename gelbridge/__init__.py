"""gelbridge: an AI assistant for end-to-end encrypted chat records in an atproto repo.

The public API is what ``__all__`` names (``docs/library.md`` teaches it; a test pins
it): embedding the bridge in a firehose or Jetstream consumer, its configuration and
errors, and the chat app's side for talking to a bot from code. Everything else is
internal and may change between releases. Names load lazily: ``import gelbridge``
stays light for the CLI.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name → the module that defines it
_EXPORTS = {
    "Bridge": "gelbridge.bridge",
    "BridgeOverloaded": "gelbridge.bridge",
    "BridgeClosed": "gelbridge.bridge",
    "AccountMixup": "gelbridge.bridge",
    "IncomingRecord": "gelbridge.ingest",
    "RecordFilter": "gelbridge.ingest",
    "JetstreamSource": "gelbridge.jetstream",
    "subscribe_url": "gelbridge.jetstream",
    "rewound": "gelbridge.jetstream",
    "Settings": "gelbridge.config",
    "load_config": "gelbridge.config",
    "GelbridgeError": "gelbridge.errors",
    "ConfigError": "gelbridge.errors",
    "FirehoseError": "gelbridge.errors",
    "ChatClient": "gelbridge.chat_client",
    "Keyring": "gelbridge.sealing",
}

__all__ = [
    "AccountMixup", "Bridge", "BridgeClosed", "BridgeOverloaded", "ChatClient", "ConfigError", "FirehoseError",
    "GelbridgeError", "IncomingRecord", "JetstreamSource", "Keyring", "RecordFilter", "Settings", "load_config",
    "rewound", "subscribe_url", "__version__",
]
assert sorted(_EXPORTS) + ["__version__"] == __all__

if TYPE_CHECKING:
    from gelbridge.bridge import AccountMixup, Bridge, BridgeClosed, BridgeOverloaded
    from gelbridge.chat_client import ChatClient
    from gelbridge.config import Settings, load_config
    from gelbridge.errors import ConfigError, FirehoseError, GelbridgeError
    from gelbridge.ingest import IncomingRecord, RecordFilter
    from gelbridge.jetstream import JetstreamSource, rewound, subscribe_url
    from gelbridge.sealing import Keyring


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gelbridge' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
