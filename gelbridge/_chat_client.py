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
- **Key grants** (``grant=True``, PROTOCOL.md §6), the way an app on another machine
  pairs with the bridge: the bridge key published in the repo is pinned on first use
  (:mod:`gelbridge._pairing`), each new conversation gets a fresh key, written to the
  user's keyring file before any record names it, then granted to the bridge in a
  ``keyGrant`` record; :meth:`ChatClient.rotate` gives the conversation a new key (the
  history keeps opening with the older ones while their grants exist).

It logs in with its own session (never the worker's: refresh tokens are single-use).
"""

from __future__ import annotations

import asyncio
import fcntl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gelbridge._config import Settings
from gelbridge._errors import KEYRING_ENV, ConfigError, GelbridgeError, KeyringError
from gelbridge._pairing import BridgeOffer, Pin, PinFile, bridge_offers, choose_bridge, grant_record, pins_path
from gelbridge._pds import PdsClient
from gelbridge._records import (
    BRIDGE_COLLECTION,
    KEY_GRANT_COLLECTION,
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
class Granting:
    """Where new conversation keys go (the user's keyring file) and whom they are granted
    to (the pinned bridge)."""

    keyring_path: Path
    bridge: BridgeOffer


@dataclass
class ChatClient:
    """One account's chat, as an app: the conversation it is in and where it continues."""

    pds: PdsClient
    keyring: Keyring
    key_id: str | None  # the key the next message is sealed with (granting: made at the first one)
    conversation: str = field(default_factory=new_tid)
    parent: str | None = None  # the reply the next message continues from
    last_message: str | None = None  # the newest user message that asked for a reply
    last_attempt: int = 0
    granting: Granting | None = None

    @classmethod
    async def login(cls, settings: Settings, environ: Any, *, grant: bool | None = None,
                    pairing: PairingChoice | None = None,
                    notice: Callable[[str], None] = lambda line: None) -> ChatClient:
        """Log in to the account of ``settings`` (the first ``[[accounts]]`` entry, or
        ``[account]``) with its app password and keyring. ``grant`` (default ``[client]
        grant``): pair with the bridge published in the repo, as ``pairing`` says (default:
        ``[client]``); ``notice`` gets what the user should see (the fingerprint, when a
        bridge is pinned)."""
        from gelbridge._identity import check_session_did, pds_url_of

        acct = settings.for_account(settings.accounts_list()[0]) if settings.accounts else settings
        a = acct.account
        if not a.identifier:
            raise ConfigError("set [account] identifier (a handle or DID; or GELBRIDGE_IDENTIFIER)")
        password = environ.get(a.password_env)
        if not password:
            raise ConfigError(f"no app password: set ${a.password_env}")
        granting = settings.client.grant if grant is None else grant
        ring_path, ring = _app_keyring(acct, environ, granting)
        url, expected_did = await pds_url_of(a.pds, a.identifier, acct.identity)
        pds = PdsClient(url)
        try:
            session = await pds.login(a.identifier, password)
            check_session_did(session.did, expected_did, a.identifier, url)
            paired = None
            if ring_path is not None:
                choice = pairing or PairingChoice()
                choice = PairingChoice(choice.bridge or settings.client.bridge, choice.repin,
                                       choice.fingerprint or settings.client.fingerprint)
                offer = await _pair(pds, ring_path, choice, notice)
                paired = Granting(ring_path, offer)
        except BaseException:
            await pds.aclose()
            raise
        return cls(pds, ring, None if paired is not None else sorted(ring)[0], granting=paired)

    async def aclose(self) -> None:
        await self.pds.aclose()

    async def join(self, conversation: str) -> None:
        """Continue ``conversation``: the next message follows its newest reply and is
        sealed with the conversation's newest key (when the keyring holds it)."""
        self.conversation = conversation
        self.parent, key_id = await self._conversation_state(conversation)
        if key_id is not None and key_id in self.keyring:
            self.key_id = key_id
        elif key_id is not None and self.granting is not None:
            raise KeyringError(f"conversation {conversation} is sealed with key {key_id!r}, which is not in your "
                               f"keyring {self.granting.keyring_path}: continue it from the app that holds that "
                               "key, or start a new conversation")
        elif self.granting is not None:
            self.key_id = None  # nothing sealed in it yet: a fresh key with the first message

    def new_conversation(self) -> str:
        self.conversation, self.parent, self.last_message, self.last_attempt = new_tid(), None, None, 0
        if self.granting is not None:
            self.key_id = None  # its own key, made and granted with its first message
        return self.conversation

    async def rotate(self) -> str:
        """Seal this conversation's next messages with a new key, granted to the bridge;
        returns its keyId. The older keys stay in the keyring (and granted) for the history."""
        if self.granting is None:
            raise GelbridgeError("a new key needs key grants: start with --grant (or [client] grant = true)")
        return await self._new_granted_key()

    async def _new_granted_key(self) -> str:
        """A fresh key, saved to the keyring file before any record names it, then granted."""
        g = self.granting
        assert g is not None
        self.keyring, key_id = _add_key_to_file(g.keyring_path)
        rkey = new_tid()
        await self.pds.put_record(KEY_GRANT_COLLECTION, rkey, grant_record(
            self.keyring[key_id], key_id=key_id, bridge=g.bridge, did=self.pds.did, rkey=rkey,
            created_at=now_datetime()))
        self.key_id = key_id
        return key_id

    # --- writing ---------------------------------------------------------------------------

    async def send(self, text: str = "", parts: Sequence[Part] = ()) -> str:
        """Write a sealed user message (``text`` and/or ``parts``) asking for a reply;
        returns the reply's rkey (``K.r0``)."""
        key_id = self.key_id if self.key_id is not None else await self._new_granted_key()
        k = new_tid()
        body: list[Part] = [*parts, *([TextPart(text=text)] if text else [])]
        value: dict[str, Any] = {
            "$type": MESSAGE_COLLECTION, "conversation": self.conversation, "role": "user",
            "generation": {"attempt": 0}, "createdAt": now_datetime(),
            "content": seal_content(PlainContent(parts=body), uri=AtUri(self.pds.did, MESSAGE_COLLECTION, k),
                                    key_id=key_id, keyring=self.keyring).to_value(),
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

    async def _conversation_state(self, conversation: str) -> tuple[str | None, str | None]:
        """The conversation's newest reply and the keyId of its newest sealed message."""
        reply: tuple[str, str] | None = None
        key: tuple[str, str] | None = None
        async for r in self.pds.iter_records(MESSAGE_COLLECTION):
            v = r.value
            if not isinstance(v, dict) or v.get("conversation") != conversation:
                continue
            when = str(v.get("createdAt") or "")
            if v.get("role") == "assistant" and (reply is None or when > reply[0]):
                reply = (when, r.rkey)
            content = v.get("content")
            if isinstance(content, dict) and isinstance(content.get("keyId"), str) and (key is None or when > key[0]):
                key = (when, content["keyId"])
        return (reply[1] if reply else None), (key[1] if key else None)


def _app_keyring(settings: Settings, environ: Any, granting: bool) -> tuple[Path | None, Keyring]:
    """The user's keyring, and its path when granting (the file may not exist yet: the
    first grant makes it)."""
    from gelbridge._sealing import load_keyring

    if not granting:
        ring = load_keyring(settings, environ)
        if len(ring) == 0:
            raise ConfigError("the keyring holds no key: add one with 'gelbridge keys new --keyring FILE', "
                              "or pair with the bridge: --grant")
        return None, ring
    raw = settings.keyring.path or environ.get(KEYRING_ENV)
    if not raw:
        raise ConfigError("--grant keeps the conversation keys it makes in your keyring: set [keyring] path "
                          f"(or ${KEYRING_ENV}) to a file (it is created if missing)")
    path = Path(raw).expanduser()
    return path, (Keyring.load(path) if path.exists() else Keyring())


@dataclass(frozen=True)
class PairingChoice:
    """Which bridge to grant keys to (``--bridge``, ``--repin``, ``--fingerprint``; see
    :func:`gelbridge._pairing.choose_bridge`)."""

    bridge: str | None = None
    repin: bool = False
    fingerprint: str | None = None


async def _pair(pds: PdsClient, ring_path: Path, choice: PairingChoice,
                notice: Callable[[str], None]) -> BridgeOffer:
    """The bridge to grant to: the repo's bridge records against the pin (pinned now when
    new, and said)."""
    offers = bridge_offers([(r.rkey, r.value) async for r in pds.iter_records(BRIDGE_COLLECTION)])
    pins = PinFile.load(pins_path(ring_path))
    pinned = pins.get(pds.did)
    offer = choose_bridge(offers, pinned=pinned, want=choice.bridge, repin=choice.repin,
                          fingerprint=choice.fingerprint)
    if pinned != Pin(offer.kid, offer.public_key):
        pins.pin(pds.did, offer)
        notice(f"pinned bridge {offer.label} for {pds.did} in {pins.path}: check that fingerprint with the "
               "bridge's operator ('gelbridge keys bridge-show' prints it); a changed key will be refused")
    return offer


def _add_key_to_file(path: Path) -> tuple[Keyring, str]:
    """Add a fresh key to the keyring file (re-read under a lock, so two apps adding keys at
    once both keep theirs); returns the keyring now on disk and the new keyId."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ring = Keyring.load(path) if path.exists() else Keyring()
        key_id = ring.add_new()
        ring.save(path)
    return ring, key_id
