"""The least scope gelbridge asks for, and the check of what was granted.

From the atproto permission spec (https://atproto.com/specs/permission) and what the
reference PDS enforces (docs/research/oauth.md §1):

- ``atproto`` is required in every request and every grant.
- ``repo:<nsid>`` names one collection; without ``action`` it allows create, update and
  delete. ``putRecord`` needs both ``create`` and ``update``, even for a new record.
  Partial wildcards (``repo:chat.gel.assistant.*``) are not allowed, and the PDS *drops*
  them without an error: so each collection is named, and the granted scope is checked.
- ``blob:<mime>`` allows uploads of that type; gelbridge uploads only
  ``application/octet-stream`` (sealed bytes).

What the bridge writes: its replies (``putRecord`` on messages: create and update, never
delete) and its bridge record (``putRecord``; ``keys bridge-retire`` deletes one). Reads
(records, blobs, the firehose) need no scope: they are public.
"""

from __future__ import annotations

from typing import Final

from gelbridge._errors import OAuthError
from gelbridge._records.constants import BRIDGE_COLLECTION, MESSAGE_COLLECTION

#: every scope the bridge needs, and nothing else (in the order requested)
BRIDGE_SCOPES: Final[tuple[str, ...]] = (
    "atproto",
    f"repo:{MESSAGE_COLLECTION}?action=create&action=update",
    f"repo:{BRIDGE_COLLECTION}",
    "blob:application/octet-stream",
)

#: the ``scope`` parameter of the authorization request
BRIDGE_SCOPE: Final[str] = " ".join(BRIDGE_SCOPES)


def granted_scopes(scope: object) -> frozenset[str]:
    """The scopes of a token response's ``scope`` (space-separated); none when absent."""
    return frozenset(scope.split()) if isinstance(scope, str) else frozenset()


def check_granted(requested: str, granted: object) -> frozenset[str]:
    """Refuse a grant that lacks ``atproto`` or any scope requested; returns what was
    granted beyond the request (a broader session than gelbridge asked for: worth a warning)."""
    got = granted_scopes(granted)
    if not got:
        raise OAuthError("the token response names no scope: refusing it (atproto OAuth requires the granted "
                         "scope in every token response)")
    want = granted_scopes(requested) | {"atproto"}
    missing = sorted(want - got)
    if missing:
        raise OAuthError(f"the session was granted without {', '.join(missing)}: gelbridge cannot write its "
                         "replies with it; the PDS may not support granular scopes (it needs "
                         "@atproto/pds 0.4.166 or newer), or the request was changed on the way")
    return frozenset(got - want)
