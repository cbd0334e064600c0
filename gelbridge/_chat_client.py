"""The chat app's side of the protocol, for ``gelbridge send`` and ``gelbridge chat``: it
writes sealed user messages into the account's repo as a chat app would, and reads the
reply records back as they stream in (PROTOCOL.md §4, §5).

- A message is sealed with the keyring's first key, asks for a reply with
  ``generation``, and continues the conversation from its newest reply (``parent``).
- :meth:`ChatClient.regenerate` raises the message's ``attempt`` (§4.1): the worker
  writes ``K.r{n+1}``; the conversation continues from that reply.
- :meth:`ChatClient.answer_approvals` answers a reply waiting for approval with one
  ``toolApprovalPart`` per waiting call (§5), in a new message whose parent is that reply.
- :meth:`ChatClient.follow` polls the reply record until it is final, calling back
  with each new stretch of text; bounded by its timeout.

It logs in with its own session (never the worker's: refresh tokens are single-use).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gelbridge._config import Settings
from gelbridge._errors import ConfigError, GelbridgeError
from gelbridge._pds import PdsClient
from gelbridge._records import (
    MESSAGE_COLLECTION,
    AtUri,
    PlainContent,
    TextPart,
    ToolApprovalPart,
    ToolCallPart,
    new_tid,
    now_datetime,
)
from gelbridge._records.constants import FINAL_STATUSES
from gelbridge._records.models import MessageRecord, Part
from gelbridge._sealing import Keyring, content_of, seal_content

#: How often a streaming reply is read again (its progress writes come every ~2 s).
POLL_SECONDS = 0.5


@dataclass
class Reply:
    """A reply record as the app sees it: its status and opened content (None when it
    cannot be opened)."""

    rkey: str
    record: MessageRecord
    content: PlainContent | None

    @property
    def status(self) -> str:
        return str(self.record.status or "")

    @property
    def text(self) -> str:
        """The reply's text parts in order; the text after a tool call starts on a new
        line (it only ever grows as the reply streams in)."""
        pieces: list[str] = []
        after_other = False
        for p in self.content.parts if self.content else ():
            if isinstance(p, TextPart):
                pieces.append(("\n" if after_other and pieces else "") + p.text)
                after_other = False
            else:
                after_other = True
        return "".join(pieces)

    def waiting_calls(self) -> list[ToolCallPart]:
        """The tool calls this reply waits on (``approval: pending``)."""
        if self.content is None or self.status != "awaitingApproval":
            return []
        return [p for p in self.content.parts if isinstance(p, ToolCallPart) and p.approval == "pending"]


@dataclass
class ChatClient:
    """One account's chat, as an app: the conversation it is in and where it continues."""

    pds: PdsClient
    keyring: Keyring
    key_id: str
    conversation: str = field(default_factory=new_tid)
    parent: str | None = None  # the reply the next message continues from
    last_message: str | None = None  # the newest user message that asked for a reply
    last_attempt: int = 0

    @classmethod
    async def login(cls, settings: Settings, environ: Any) -> ChatClient:
        """Log in to the account of ``settings`` (the first ``[[accounts]]`` entry, or
        ``[account]``) with its app password and keyring."""
        from gelbridge._identity import check_session_did, pds_url_of
        from gelbridge._sealing import load_keyring

        acct = settings.for_account(settings.accounts_list()[0]) if settings.accounts else settings
        a = acct.account
        if not a.identifier:
            raise ConfigError("set [account] identifier (a handle or DID; or GELBRIDGE_IDENTIFIER)")
        password = environ.get(a.password_env)
        if not password:
            raise ConfigError(f"no app password: set ${a.password_env}")
        ring = load_keyring(acct)
        if len(ring) == 0:
            raise ConfigError("the keyring holds no key: add one with 'gelbridge keys new --keyring FILE'")
        url, expected_did = await pds_url_of(a.pds, a.identifier, acct.identity)
        pds = PdsClient(url)
        try:
            session = await pds.login(a.identifier, password)
            check_session_did(session.did, expected_did, a.identifier, url)
        except BaseException:
            await pds.aclose()
            raise
        return cls(pds, ring, sorted(ring)[0])

    async def aclose(self) -> None:
        await self.pds.aclose()

    async def join(self, conversation: str) -> None:
        """Continue ``conversation``: the next message follows its newest reply."""
        self.conversation = conversation
        self.parent = await self._newest_reply(conversation)

    def new_conversation(self) -> str:
        self.conversation, self.parent, self.last_message, self.last_attempt = new_tid(), None, None, 0
        return self.conversation

    # --- writing ---------------------------------------------------------------------------

    async def send(self, text: str = "", parts: Sequence[Part] = ()) -> str:
        """Write a sealed user message (``text`` and/or ``parts``) asking for a reply;
        returns the reply's rkey (``K.r0``)."""
        k = new_tid()
        body: list[Part] = [*parts, *([TextPart(text=text)] if text else [])]
        value: dict[str, Any] = {
            "$type": MESSAGE_COLLECTION, "conversation": self.conversation, "role": "user",
            "generation": {"attempt": 0}, "createdAt": now_datetime(),
            "content": seal_content(PlainContent(parts=body), uri=AtUri(self.pds.did, MESSAGE_COLLECTION, k),
                                    key_id=self.key_id, keyring=self.keyring).to_value(),
        }
        if self.parent is not None:
            value["parent"] = self.parent
        await self.pds.put_record(MESSAGE_COLLECTION, k, value)
        self.last_message, self.last_attempt = k, 0
        return f"{k}.r0"

    async def regenerate(self) -> str:
        """Ask again for the newest message's reply (attempt + 1); returns the new reply's rkey."""
        if self.last_message is None:
            raise GelbridgeError("nothing to regenerate yet: send a message first")
        got = await self.pds.get_record(MESSAGE_COLLECTION, self.last_message)
        if got is None:
            raise GelbridgeError(f"message {self.last_message} is gone from the repo")
        value = dict(got[1])
        self.last_attempt += 1
        value["generation"] = {**(value.get("generation") or {}), "attempt": self.last_attempt}
        await self.pds.put_record(MESSAGE_COLLECTION, self.last_message, value, swap_record=got[0])
        return f"{self.last_message}.r{self.last_attempt}"

    async def answer_approvals(self, reply: Reply, answers: dict[str, tuple[bool, str | None]]) -> str:
        """Answer ``reply``'s waiting calls (``call id → (approved, reason)``; a call not
        named is denied, as the protocol says); returns the rkey of the reply to it."""
        self.parent = reply.rkey
        parts = [ToolApprovalPart(call_id=c.call_id, approved=answers.get(c.call_id, (False, None))[0],
                                  reason=answers.get(c.call_id, (False, None))[1])
                 for c in reply.waiting_calls()]
        return await self.send(parts=parts)

    # --- reading ---------------------------------------------------------------------------

    async def read(self, rkey: str) -> Reply | None:
        got = await self.pds.get_record(MESSAGE_COLLECTION, rkey)
        if got is None:
            return None
        uri = AtUri(self.pds.did, MESSAGE_COLLECTION, rkey)
        rec = MessageRecord.from_value(got[1], uri=str(uri))
        try:
            content = content_of(rec.content, uri=uri, keyring=self.keyring)
        except GelbridgeError:
            content = None
        return Reply(rkey, rec, content)

    async def follow(self, rkey: str, on_text: Callable[[str], None], timeout: float) -> Reply | None:
        """Read ``rkey`` until it is final; ``on_text`` gets each new stretch of text as
        the progress updates land. Returns the final reply (and continues the
        conversation from it), or None when none was final within ``timeout`` s."""
        shown = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = await self.read(rkey)
            if reply is not None:
                text = reply.text if reply.content is not None else shown
                if text.startswith(shown) and len(text) > len(shown):
                    on_text(text[len(shown):])
                    shown = text
                if reply.status in FINAL_STATUSES:
                    self.parent = rkey
                    return reply
            await asyncio.sleep(POLL_SECONDS)
        return None

    async def _newest_reply(self, conversation: str) -> str | None:
        best: tuple[str, str] | None = None
        async for r in self.pds.iter_records(MESSAGE_COLLECTION):
            v = r.value
            if isinstance(v, dict) and v.get("conversation") == conversation and v.get("role") == "assistant":
                when = str(v.get("createdAt") or "")
                if best is None or when > best[0]:
                    best = (when, r.rkey)
        return best[1] if best is not None else None
