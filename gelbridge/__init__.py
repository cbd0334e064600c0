"""gelbridge: an AI assistant for end-to-end encrypted chat records in an atproto repo."""

from gelbridge.config import Settings, load_config
from gelbridge.errors import GelbridgeError

__all__ = ["Bridge", "GelbridgeError", "Settings", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:  # lazy: `import gelbridge` stays light for the CLI
    if name == "Bridge":
        from gelbridge.bridge import Bridge

        return Bridge
    raise AttributeError(f"module 'gelbridge' has no attribute {name!r}")
