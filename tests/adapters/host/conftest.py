"""Helpers: write a small adapter script and load it with chosen limits and engine."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import SandboxLimits, available_engines

ENGINES = available_engines()
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


MakeAdapter = Callable[..., Adapter]


@pytest.fixture
def make_adapter(tmp_path: Path, engine: str) -> MakeAdapter:
    """make_adapter(body, name=..., **limits): body is the Lua of transform_request(raw)."""
    counter = [0]

    def make(body: str, *, name: str = "t", extra: str = "", allow_hosts: list[str] | None = None,
             **limits: object) -> Adapter:
        counter[0] += 1
        path = tmp_path / f"{name}_{counter[0]}.lua"
        path.write_text(
            f"local adapter = {{ name = {name!r} }}\n"
            + textwrap.dedent(extra)
            + "function adapter.transform_request(raw)\n"
            + textwrap.dedent(body)
            + "\nend\n"
            + "function adapter.transform_response(raw) return raw end\n"
            + "return adapter\n"
        )
        lim = SandboxLimits(engine=engine, **limits)  # type: ignore[arg-type]
        return load_adapter(path, limits=lim, allow_hosts={name: allow_hosts or []})

    return make
