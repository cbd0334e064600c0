"""``gelbridge check`` without a PDS: problems it finds in the files alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gelbridge._check import check_settings
from gelbridge._config import Settings


def test_an_adapter_script_that_does_not_load_is_named_with_its_file(tmp_path: Path) -> None:
    (tmp_path / "broken.lua").write_text("return {name = 'broken', transform_request = function(\n")
    settings = Settings.model_validate({"adapters": {"dirs": [str(tmp_path)]}})
    rep = asyncio.run(check_settings(settings, environ={}, login=False))
    [line] = [p for p in rep.problems if p.startswith("[adapters]")]
    assert f"{tmp_path / 'broken.lua'}: does not load:" in line
