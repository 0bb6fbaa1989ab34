"""A Django test runner that only creates and migrates the test databases the given tests use, and keeps them.

The peer suite runs it directly against PostgreSQL (with --keepdb), installs cowproxy on the databases it
made, and then runs the same tests through the proxy in a session (with --keepdb, so Django reuses them).
"""

import contextlib
import json
import os
import sys
import time
import unittest
from collections.abc import Iterator
from typing import Any

from django.db import connections
from django.test.runner import DiscoverRunner


class TimingResult(unittest.TextTestResult):
    """Django's text result, adding up the wall time of each test module (its tests and class fixtures).

    The time from the end of one test to the start of the next (the next class's ``setUpClass`` and
    ``setUpTestData``, the previous one's ``tearDownClass``) counts for the next test's module. At the end it
    prints one ``cowpeer-timing:`` line of JSON, which tests/peers/django_suite.py reads.
    """

    def startTestRun(self) -> None:
        super().startTestRun()
        self._seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def _charge(self, test: unittest.TestCase) -> None:
        now = time.perf_counter()
        module = type(test).__module__.split(".")[0]
        self._seconds[module] = self._seconds.get(module, 0.0) + now - self._mark
        self._mark = now

    def startTest(self, test: unittest.TestCase) -> None:
        self._charge(test)
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self._charge(test)

    def stopTestRun(self) -> None:
        super().stopTestRun()
        rounded = {m: round(s, 3) for m, s in sorted(self._seconds.items())}
        # On a line of its own: the dots of verbosity 1 end without a newline.
        print("\ncowpeer-timing: " + json.dumps(rounded), file=sys.stderr)


class TimingRunner(DiscoverRunner):
    """Django's runner with the per-module timing of ``TimingResult`` (the direct run uses it as is)."""

    def get_resultclass(self) -> Any:
        return super().get_resultclass() or TimingResult


class PrepareRunner(DiscoverRunner):
    def run_tests(self, test_labels: list[str], **kwargs: Any) -> int:
        self.setup_test_environment()
        suite = self.build_suite(test_labels)
        databases = self.get_databases(suite)
        self.setup_databases(aliases=databases, serialized_aliases=set())
        print("cowpeer-databases: " + " ".join(sorted(databases)))
        self.teardown_test_environment()
        return 0


class SessionRunner(TimingRunner):
    """The test runner of the session run: Django's own, except that the maintenance connection is untagged.

    With ``--keepdb`` Django first connects to the ``postgres`` database to see whether the test database
    exists. cowproxy refuses a tagged connection to a database without the layer (fail closed), so that one
    connection goes through the proxy without the session tag; every connection to a test database has it.
    """

    def setup_databases(self, **kwargs: Any) -> Any:
        for conn in connections.all():
            conn._nodb_cursor = _untagged_nodb_cursor(conn)  # type: ignore[method-assign]
        if os.environ.get("COWPEER_JOIN_OPTIONS"):
            _introspect_as_outside()
        return super().setup_databases(**kwargs)


# For the session joined without the proxy (django_suite.py --breakdown), what the proxy does to two kinds of
# statement, so that the run goes like the proxied one: Django's introspection asks pg_table_is_visible(),
# which in a session answers for the overlay views (migrate would see no table, flush truncate none), so
# those calls are pointed at the layer's functions (the proxy's introspection rewrite, docs/rewrites.md);
# and Django's flush (TRUNCATE, after every TransactionTestCase test) goes through the proxy's own rewriter
# (chained deletes through the views). The proxy's other rewrites (ON CONFLICT, GROUP BY, ...) are missing.
_AS_OUTSIDE = (
    ("pg_catalog.pg_table_is_visible(", "cow.pg_table_is_visible("),
    ("pg_get_serial_sequence(", "cow.pg_get_serial_sequence("),
)


def _introspect_as_outside() -> None:
    from django.db.backends import utils

    from proxy.sql import CATALOG_QUERY, Analyzer, Catalog

    execute = utils.CursorWrapper.execute
    analyzer = Analyzer()
    catalogs: dict[str, Catalog] = {}

    def execute_as_outside(self: Any, sql: str, params: Any = None) -> Any:
        # the table list (no parameters) as the proxy writes it: visibility as a set (docs/rewrites.md)
        table_list = params is None and "pg_table_is_visible(" in sql
        if params is None and (table_list or sql.lstrip()[:8].upper() == "TRUNCATE"):
            name = self.db.settings_dict["NAME"]
            if name not in catalogs:  # (the layer's tables do not change during the run)
                self.cursor.execute(CATALOG_QUERY)
                catalogs[name] = Catalog.from_rows(self.cursor.fetchall())
            rewritten = analyzer.analyze(sql, catalogs[name], True).rewritten
            if rewritten is not None:
                return execute(self, rewritten, params)
        for call, layer_call in _AS_OUTSIDE:
            if call in sql:
                sql = sql.replace(call, layer_call)
        return execute(self, sql, params)

    utils.CursorWrapper.execute = execute_as_outside  # type: ignore[method-assign]


def _untagged_nodb_cursor(conn: Any) -> Any:
    original = type(conn)._nodb_cursor

    @contextlib.contextmanager
    def nodb_cursor() -> Iterator[Any]:
        options = conn.settings_dict["OPTIONS"]
        saved = options.pop("options", None)
        try:
            with original(conn) as cursor:
                if saved is not None:
                    options["options"] = saved
                    saved = None
                yield cursor
        finally:
            if saved is not None:
                options["options"] = saved

    return nodb_cursor
