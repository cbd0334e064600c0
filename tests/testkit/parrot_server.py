"""A tiny local server for the made-up "parrot" provider (see scripts/parrot.lua).

Answers come from a FIFO of dicts: ``said``, ``mused``, ``tricks`` [(tag, trick, args)],
``whole`` (stream tricks as one ``whole_trick`` frame), ``why``, ``beak`` (in, out).
Every request body is recorded.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ParrotServer:
    def __init__(self) -> None:
        self.answers: deque[dict[str, Any]] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                owner.headers.append({k.lower(): v for k, v in self.headers.items()})
                a = owner.answers.popleft() if owner.answers else {"said": "squawk"}
                if self.path != "/squawk":
                    return self._send(404, "application/json", b'{"error": "no perch here"}')
                if body.get("loud"):
                    frames = b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in _frames(a))
                    return self._send(200, "text/event-stream", frames + b"data: [DONE]\n\n")
                self._send(200, "application/json", json.dumps(_whole(a)).encode())

            def _send(self, status: int, ctype: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> ParrotServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def _whole(a: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"said": a.get("said", ""), "why": a.get("why", "end_turn")}
    if a.get("mused"):
        out["mused"] = a["mused"]
    if a.get("tricks"):
        out["tricks"] = [{"tag": t, "trick": n, "with": json.dumps(args)} for t, n, args in a["tricks"]]
    if a.get("beak"):
        out["beak"] = {"seeds_in": a["beak"][0], "seeds_out": a["beak"][1]}
    return out


def _frames(a: dict[str, Any]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = [{"nap": True}]
    if a.get("mused"):
        frames += [{"muse": a["mused"][i:i + 4]} for i in range(0, len(a["mused"]), 4)]
    said = a.get("said", "")
    frames += [{"peck": said[i:i + 3]} for i in range(0, len(said), 3)]
    tricks = a.get("tricks") or []
    if a.get("whole"):
        frames += [{"whole_trick": {"tag": t, "trick": n, "with": args}} for t, n, args in tricks]
    else:
        for slot, (t, n, _args) in enumerate(tricks):
            frames.append({"trick_start": {"slot": slot, "tag": t, "trick": n}})
        # argument pieces of all calls, interleaved
        texts = [json.dumps(args) for _, _, args in tricks]
        for i in range(0, max((len(t) for t in texts), default=0), 5):
            for slot, text in enumerate(texts):
                if text[i:i + 5]:
                    frames.append({"trick_bit": {"slot": slot, "bit": text[i:i + 5]}})
    if a.get("beak"):
        frames.append({"beak": {"seeds_in": a["beak"][0], "seeds_out": 0}})
        frames.append({"beak": {"seeds_in": a["beak"][0], "seeds_out": a["beak"][1]}})
    frames.append({"why": a.get("why", "end_turn")})
    return frames
