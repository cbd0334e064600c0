"""Fixtures for the built-in adapter tests: a ModelServer on 127.0.0.1 per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gelbridge._dev.model_server import ModelServer
from testkit import builtin_harness as harness


@pytest.fixture
def server() -> Iterator[ModelServer]:
    """Requires the test API key on every provider route (Ollama sends none: see ollama_server)."""
    with ModelServer(api_key=harness.API_KEY, chunk_size=5) as srv:
        yield srv


@pytest.fixture
def open_server() -> Iterator[ModelServer]:
    with ModelServer(chunk_size=5) as srv:
        yield srv


@pytest.fixture(params=harness.NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def srv(name: str, server: ModelServer, open_server: ModelServer) -> ModelServer:
    """The server for ``name``: Ollama has no auth, the others need the key."""
    return open_server if name == "ollama" else server
