"""Collection NSIDs, union `$type` names and size limits of the chat.gel.assistant records."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

DEFS_NSID: Final = "chat.gel.assistant.defs"
MESSAGE_COLLECTION: Final = "chat.gel.assistant.message"
CONVERSATION_COLLECTION: Final = "chat.gel.assistant.conversation"
SETTINGS_COLLECTION: Final = "chat.gel.assistant.settings"
SETTINGS_RKEY: Final = "self"
#: PROTOCOL.md §6 (v1.1): the bridge's public keys (written by gelbridge) and the apps'
#: key grants to them
BRIDGE_COLLECTION: Final = "chat.gel.assistant.bridge"
KEY_GRANT_COLLECTION: Final = "chat.gel.assistant.keyGrant"

COLLECTIONS: Final = (MESSAGE_COLLECTION, CONVERSATION_COLLECTION, SETTINGS_COLLECTION, BRIDGE_COLLECTION,
                      KEY_GRANT_COLLECTION)


def defs_type(name: str) -> str:
    """The full union `$type` of a def in chat.gel.assistant.defs (``#textPart`` → NSID#textPart)."""
    return f"{DEFS_NSID}#{name.lstrip('#')}"


ENCRYPTED_CONTENT_TYPE: Final = defs_type("encryptedContent")
PLAIN_CONTENT_TYPE: Final = defs_type("plainContent")

#: Largest record gelbridge accepts, as DAG-CBOR bytes. The firehose carries record
#: blocks up to 1 MiB; a record larger than that cannot be in a repo.
MAX_RECORD_BYTES: Final = 1024 * 1024

#: How deep objects and arrays may nest in anything gelbridge reads
#: (``gelbridge._records.nesting`` says why and checks it).
MAX_DEPTH: Final = 64

ROLE_USER: Final = "user"
ROLE_ASSISTANT: Final = "assistant"


class ReplyStatus(StrEnum):
    """A reply's ``status`` (PROTOCOL.md §4.1). Members are ``str``: they compare equal
    to, and serialise as, the wire values. The record field stays open (``str``): another
    app's unknown status is kept, not rejected; a claim's status is always one of these."""

    PENDING = "pending"
    STREAMING = "streaming"
    COMPLETE = "complete"
    AWAITING_APPROVAL = "awaitingApproval"
    ERROR = "error"
    CANCELLED = "cancelled"


#: A reply in one of these states is finished: asking again for it does nothing, and it
#: is never written again.
FINAL_STATUSES: Final[frozenset[str]] = frozenset(
    {ReplyStatus.COMPLETE, ReplyStatus.AWAITING_APPROVAL, ReplyStatus.ERROR, ReplyStatus.CANCELLED}
)

MAX_ATTEMPT: Final = 1000
