"""Fixtures shared by the C relay's tests on literal bytes (tests/proxy/fast_pairs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.fastrelay import AVAILABLE, FastRelay


@pytest.fixture(scope="module")
def fast() -> Iterator[FastRelay]:
    """One C engine per test module (its thread and eventfd), closed at the module's end."""
    if not AVAILABLE:
        pytest.skip("the C relay is not built")
    relay = FastRelay()
    yield relay
    relay.close()
