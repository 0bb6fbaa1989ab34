"""Django's own test suite (a CI-sized subset of its ORM modules) fails nowhere in a session where it passes
directly: tests/peers/django_suite.py, on the test server (the embedded PostgreSQL 18, or COW_TEST_DSN).

The whole module list runs by hand: ``python -m tests.peers.django_suite --dsn …`` (docs/layer.md, "Django's
test suite in a session").
"""

from __future__ import annotations

import pytest

from tests.fix_db import PgServer
from tests.peers.django_suite import CI_MODULES, Server, compare, report

pytestmark = pytest.mark.timeout(1200)


def test_django_ci_modules_fail_nowhere_only_in_a_session(pg_server: PgServer) -> None:
    comparison = compare(Server.from_dsn(pg_server.dsn), CI_MODULES)
    print(report(comparison))
    assert comparison.direct.ran == comparison.session.ran > 250
    assert comparison.session_only == [], report(comparison)
