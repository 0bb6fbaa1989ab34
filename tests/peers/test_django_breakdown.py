"""The session without the proxy of ``django_suite.py --breakdown``: its startup options join the session as
``cow.use_session`` does, so the third run measures the layer's time in that session."""

from __future__ import annotations

import psycopg

from tests.peers.django_suite import SESSION, join_options


def test_join_options_join_the_session_as_use_session_does(layer_db: str) -> None:
    settings = (
        "SELECT current_setting('search_path'), cow.current_session(), current_setting('cow.app_search_path')"
    )
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session(%s)", (SESSION,))
        joined = conn.execute(settings).fetchone()
    options = join_options(layer_db)
    assert "\\ " in options  # the paths' spaces, escaped for libpq
    with psycopg.connect(layer_db, autocommit=True, options=options) as conn:
        assert conn.execute(settings).fetchone() == joined
        # An unqualified write goes to the session's changes, not to the base table.
        conn.execute("UPDATE customers SET name = 'In the session' WHERE id = 1")
        assert conn.execute("SELECT name FROM customers WHERE id = 1").fetchone() == ("In the session",)
        assert conn.execute("SELECT name FROM public.customers WHERE id = 1").fetchone() == ("Ada",)
