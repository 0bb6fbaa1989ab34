"""``SET CONSTRAINTS <name>`` inside a session also names the layer's constraint trigger of that name.

The layer checks a deferrable constraint of a CoW table in a session with a constraint trigger of the same
name in schema ``cow_changes``; PostgreSQL resolves an unqualified name in the first schema on
``search_path`` that has it (the app's own constraint), so the rewrite adds ``cow_changes.<name>``. Analysed
against the catalog of a real layer database, and the rewritten statements run there.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from proxy.sql import CATALOG_QUERY, Analyzer, Catalog

install_layer = pytest.importorskip("migrations").__dict__.get("install_layer")

SCHEMA = """
CREATE SCHEMA other;
CREATE TABLE parents (
    id int PRIMARY KEY,
    code int CONSTRAINT parents_code_key UNIQUE DEFERRABLE INITIALLY IMMEDIATE,
    tag int CONSTRAINT parents_tag_key UNIQUE,
    alt int CONSTRAINT dup UNIQUE DEFERRABLE INITIALLY IMMEDIATE
);
CREATE TABLE children (
    id int PRIMARY KEY,
    parent_id int CONSTRAINT "Children FK" REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED,
    -- the same name as the parents' UNIQUE, another mode: two triggers on the parents' changes table
    other_id int CONSTRAINT dup REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED
);
CREATE TABLE other.things (id int PRIMARY KEY, n int CONSTRAINT things_n_key UNIQUE DEFERRABLE);
INSERT INTO parents VALUES (1, 1, 1, 1), (2, 2, 2, 2);
INSERT INTO children VALUES (1, 1);
"""


@pytest.fixture(scope="module")
def layer(create_database: Callable[..., str]) -> Iterator[tuple[psycopg.Connection[Any], Catalog]]:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)

    async def install() -> None:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            await install_layer(conn, schemas=("public",))
        finally:
            await conn.close()

    asyncio.run(install())
    with psycopg.connect(dsn, autocommit=True) as conn:
        catalog = Catalog.from_rows(conn.execute(CATALOG_QUERY).fetchall())
        conn.execute("SELECT cow.use_session('setc')")
        yield conn, catalog


def rewritten(catalog: Catalog, sql: str, in_session: bool = True) -> str | None:
    analysis = Analyzer().analyze(sql, catalog, in_session)
    assert analysis.error is None, analysis.error
    return analysis.rewritten


def test_catalog_lists_the_constraint_triggers(layer: tuple[Any, Catalog]) -> None:
    _, catalog = layer
    parents = catalog.tables[("public", "parents")]
    children = catalog.tables[("public", "children")]
    # the foreign key's trigger sits on both changes tables (the parent's checks deleted parents)
    assert {(d.schema, d.name, d.trigger) for d in parents.deferrable if d.name != "dup"} == {
        ("public", "parents_code_key", "parents_code_key"),
        ("public", "Children FK", "Children FK"),
    }
    assert {(d.schema, d.name, d.trigger) for d in children.deferrable} == {
        ("public", "Children FK", "Children FK"),
        ("public", "dup", "dup"),
    }
    assert catalog.constraint_triggers(None, "parents_code_key") == ("parents_code_key",)
    assert catalog.constraint_triggers("public", "Children FK") == ("Children FK",)
    assert catalog.constraint_triggers("other", "Children FK") == ()
    assert catalog.constraint_triggers(None, "parents_tag_key") == ()  # not deferrable
    # the second trigger of a name is <name>_<n>: both belong to both constraints named dup
    dup = catalog.constraint_triggers(None, "dup")
    assert len(dup) == 2 and dup[0] == "dup" and re.fullmatch(r"dup_[0-9]+", dup[1]), dup


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "SET CONSTRAINTS parents_code_key DEFERRED",
            "SET CONSTRAINTS parents_code_key, cow_changes.parents_code_key DEFERRED",
        ),
        (
            'SET CONSTRAINTS public."Children FK", parents_code_key IMMEDIATE',
            'SET CONSTRAINTS public."Children FK", parents_code_key, cow_changes."Children FK", '
            "cow_changes.parents_code_key IMMEDIATE",
        ),
        (  # a name given twice: its trigger added once
            "SET CONSTRAINTS parents_code_key, parents_code_key DEFERRED",
            "SET CONSTRAINTS parents_code_key, parents_code_key, cow_changes.parents_code_key DEFERRED",
        ),
        ("SET CONSTRAINTS ALL DEFERRED", None),
        ("SET CONSTRAINTS ALL IMMEDIATE", None),
        ("SET CONSTRAINTS no_such_constraint DEFERRED", None),  # PostgreSQL's 42704 stays
        ("SET CONSTRAINTS parents_tag_key DEFERRED", None),  # PostgreSQL's 55000 stays
        ("SET CONSTRAINTS other.parents_code_key DEFERRED", None),  # not an app schema of a CoW table
        ("SET CONSTRAINTS things_n_key DEFERRED", None),  # other.things is not a CoW table
        ("SET CONSTRAINTS db.public.parents_code_key DEFERRED", None),  # PostgreSQL's 0A000 stays
    ],
)
def test_rewrite(layer: tuple[Any, Catalog], sql: str, expected: str | None) -> None:
    _, catalog = layer
    assert rewritten(catalog, sql) == expected


def test_untagged_and_empty_catalog_unchanged(layer: tuple[Any, Catalog]) -> None:
    _, catalog = layer
    assert rewritten(catalog, "SET CONSTRAINTS parents_code_key DEFERRED", in_session=False) is None
    assert rewritten(Catalog.empty(), "SET CONSTRAINTS parents_code_key DEFERRED") is None


def test_rewrite_is_catalog_dependent(layer: tuple[Any, Catalog]) -> None:
    _, catalog = layer
    assert Analyzer().analyze("SET CONSTRAINTS parents_code_key DEFERRED", catalog, True).catalog_dependent


def test_multi_statement(layer: tuple[Any, Catalog]) -> None:
    _, catalog = layer
    assert rewritten(catalog, "BEGIN; SET CONSTRAINTS parents_code_key DEFERRED") == (
        "BEGIN\n; SET CONSTRAINTS parents_code_key, cow_changes.parents_code_key DEFERRED"
    )


def test_rewritten_statement_defers_the_session_check(layer: tuple[Any, Catalog]) -> None:
    conn, catalog = layer
    sql = rewritten(catalog, "SET CONSTRAINTS parents_code_key DEFERRED")
    assert sql is not None
    with conn.transaction(force_rollback=True):
        conn.execute(sql)
        conn.execute("UPDATE parents SET code = 2 WHERE id = 1")  # transiently a duplicate
        conn.execute("UPDATE parents SET code = 1 WHERE id = 2")
        immediate = rewritten(catalog, "SET CONSTRAINTS parents_code_key IMMEDIATE")
        assert immediate is not None
        conn.execute(immediate)  # nothing pending that fails
    with conn.transaction(force_rollback=True):
        conn.execute(sql)
        conn.execute("UPDATE parents SET code = 2 WHERE id = 1")
        with pytest.raises(psycopg.errors.UniqueViolation) as raised:
            conn.execute(immediate)
        assert raised.value.diag.constraint_name == "parents_code_key"


def test_both_triggers_of_a_shared_name_run(layer: tuple[Any, Catalog]) -> None:
    conn, catalog = layer
    sql = rewritten(catalog, "SET CONSTRAINTS dup IMMEDIATE")
    assert sql is not None and sql.count("cow_changes.") == 2
    with conn.transaction(force_rollback=True):
        conn.execute("SET CONSTRAINTS dup DEFERRED")  # plain: the app's two constraints
        conn.execute("INSERT INTO children VALUES (9, 1, 99)")  # dup: no parent 99
        with pytest.raises(psycopg.errors.ForeignKeyViolation) as raised:
            conn.execute(sql)
        assert raised.value.diag.constraint_name == "dup"


def test_unknown_name_still_fails(layer: tuple[Any, Catalog]) -> None:
    conn, _ = layer
    with conn.transaction(force_rollback=True), pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SET CONSTRAINTS no_such_constraint DEFERRED")
