"""Fixtures shared by the sealing tests."""

from __future__ import annotations

import pytest

from gelbridge._sealing import Keyring


@pytest.fixture(scope="module")
def ring() -> Keyring:
    """A keyring with two fresh keys, ``k1`` and ``k2`` (one per test module)."""
    r = Keyring()
    r.add_new("k1")
    r.add_new("k2")
    return r
