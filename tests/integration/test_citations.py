"""Citations on the real PDS: an answer citing 5,000 pages, whose stream carries lines of
more than 1 MiB (the Responses API repeats every annotation in its closing events), keeps
its text and the first 256 safe pages; URLs an app must not open (``javascript:``,
``data:``, ``vbscript:``, ``file:``, control characters) never become sourceParts; a line
past the 16 MiB bound ends the reply with one clear error. The official SDK reads the same
stream."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from gelbridge._dev import _wire_openai_responses as wire
from gelbridge._dev._wire_common import WireContext
from gelbridge._dev.model_server import Citation, ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import SourcePart, TextPart, new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(240)]

MiB = 1024 * 1024
HOSTILE = ["javascript:alert(document.cookie)", "data:text/html;base64,PHNjcmlwdD4=", "vbscript:msgbox(1)",
           "file:///etc/passwd", "https://e.example/\x1b]8;;https://evil.example\x07click", "https://e.example/\x07"]
PAGES = [Citation(u, "hostile") for u in HOSTILE] + [
    Citation(f"https://pages.example/{'section/' * 16}page-{i:05d}?ref=search&lang=en",
             f"Page {i:05d} \x1b[1mof the search results\x1b[0m, a title of some length") for i in range(5000)]
ANSWER = Turn(text="Here is what the web says about it.", searches=["everything"], citations=PAGES, chunk_size=8)


def settings_for(dev_pds: DevPds, account: AccountInfo, tmp_path: Path, server: ModelServer):
    return make_settings(
        dev_pds.pds_url, account, tmp_path / "state", server.url,
        defaults={"model": {"provider": "oai", "id": "gpt-5"}, "tools": ["web_search"]},
        providers={"oai": {"adapter": "openai-responses", "base_url": server.url + "/v1", "max_retries": 0}},
    )


def test_the_stream_has_lines_over_1_mib_and_the_official_sdk_reads_it() -> None:
    frames = wire.render_stream(ANSWER, WireContext(model="gpt-5", seq=1, created=0, prompt_text="", chunk_size=16))
    assert max(len(f) for f in frames) > MiB  # what the old 1 MiB line bound refused
    with ModelServer() as srv:
        srv.enqueue(ANSWER)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
        with client.responses.stream(model="gpt-5", input="q", tools=[{"type": "web_search"}]) as s:
            added = sum(1 for e in s if e.type == "response.output_text.annotation.added")
            final = s.get_final_response()
    assert added == len(PAGES) and final.output_text == ANSWER.text
    assert len(final.output[1].content[0].annotations) == len(PAGES)


async def test_an_answer_citing_5000_pages_keeps_its_text_and_256_safe_sources(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    async with running_worker(settings_for(dev_pds, pds_account, tmp_path, model_server), pds_account,
                              keyring[0]) as worker:
        model_server.enqueue(ANSWER)
        k = await app.send("tell me everything", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=120)
        await worker.wait_idle(10)
    assert rec.status == "complete" and rec.error is None and rec.finish_reason == "stop"
    assert content is not None and text_of(content) == ANSWER.text
    sources = [p for p in content.parts if isinstance(p, SourcePart)]
    assert isinstance(content.parts[0], TextPart) and len(sources) == 256 == len(content.parts) - 1
    assert [s.url for s in sources] == [c.url for c in PAGES[len(HOSTILE):len(HOSTILE) + 256]]
    assert all(s.url.startswith("https://pages.example/") for s in sources)
    assert sources[0].title == "Page 00000 [1mof the search results [0m, a title of some length"  # no ESC left
    notes = {d.detail for d in worker.reports[-1].diagnostics if d.field == "content.annotations"}
    assert notes == {f"{len(HOSTILE)} citation(s) left out: not an http(s) URL, longer than 2048 bytes, "
                     "or with spaces or control characters",
                     f"{5000 - 256} citation(s) over the 256 of a reply left out"}


async def test_a_line_over_16_mib_ends_the_reply_with_one_clear_error(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    huge = Turn(text="An answer whose one citation is too large.",
                citations=[Citation("https://pages.example/a", "t" * (17 * MiB))], chunk_size=8)
    async with running_worker(settings_for(dev_pds, pds_account, tmp_path, model_server), pds_account,
                              keyring[0]) as worker:
        model_server.enqueue(huge)
        k = await app.send("and now?", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=120)
        await worker.wait_idle(10)
        assert await worker.store.unfinished_claims(app.did) == []
    assert rec.status == "error" and rec.error is not None and rec.error.kind == "server_error"
    assert rec.error.message == ("the model provider's answer could not be read: one line of its stream is "
                                 "longer than gelbridge reads (16 MiB)")
    assert [r.status for r in worker.reports] == ["error"]
    assert content is not None and text_of(content) == huge.text  # what came before the line is kept
