"""gelbridge: an AI assistant for end-to-end encrypted chat records in an atproto repo."""

from gelbridge.config import Settings, load_config
from gelbridge.errors import GelbridgeError

__all__ = ["GelbridgeError", "Settings", "load_config"]
__version__ = "0.1.0"
