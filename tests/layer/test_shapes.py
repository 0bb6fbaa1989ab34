"""Table shapes beyond the sample schema: quoted names, composite and text keys, partitions, other schemas."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.layer.test_semantics import Pair

SCHEMA = """
CREATE SCHEMA "Sales Dept";
CREATE TABLE "Sales Dept"."Line Items" (
    "Order No" int,
    "Line" smallint,
    "SKU" text NOT NULL,
    "Qty" int NOT NULL DEFAULT 1 CHECK ("Qty" <> 0),
    "When" timestamptz NOT NULL DEFAULT '2026-01-01 00:00:00+00',
    "Tags" text[] DEFAULT '{}',
    "Meta" jsonb,
    PRIMARY KEY ("Order No", "Line"),
    UNIQUE NULLS NOT DISTINCT ("SKU", "Meta")
);
INSERT INTO "Sales Dept"."Line Items" ("Order No", "Line", "SKU", "Meta")
    VALUES (1, 1, 'A', NULL), (1, 2, 'B', '{"x": 1}');
CREATE TABLE public.codes (code text COLLATE "C" PRIMARY KEY, label text);
INSERT INTO public.codes VALUES ('a', 'Alpha'), ('b', 'Beta');
CREATE TABLE "Sales Dept".coded (
    id int PRIMARY KEY, code text COLLATE "C" REFERENCES public.codes ON DELETE SET NULL
);
INSERT INTO "Sales Dept".coded VALUES (1, 'a'), (2, 'b');
CREATE TABLE public.measurements (id int, day date, v numeric, PRIMARY KEY (id, day))
    PARTITION BY RANGE (day);
CREATE TABLE public.measurements_2026 PARTITION OF public.measurements
    FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
INSERT INTO public.measurements VALUES (1, '2026-03-01', 1.5);
"""

STATEMENTS = [
    """INSERT INTO "Line Items" ("Order No", "Line", "SKU", "Tags") VALUES (1, 3, 'C', '{x,y}')
       RETURNING *""",
    """INSERT INTO "Line Items" ("Order No", "Line", "SKU") VALUES (1, 3, 'D')""",
    """INSERT INTO "Line Items" ("Order No", "Line", "SKU", "Meta") VALUES (2, 1, 'A', NULL)""",
    """UPDATE "Line Items" SET "Line" = 9, "Meta" = '{"y": [1, 2]}'
       WHERE "Order No" = 1 AND "Line" = 1 RETURNING *""",
    """UPDATE "Line Items" SET "Qty" = 0 WHERE "SKU" = 'B'""",
    """DELETE FROM "Line Items" WHERE "SKU" = 'B' RETURNING "Order No", "Line\"""",
    """INSERT INTO codes VALUES ('c', 'Gamma') RETURNING *""",
    """UPDATE coded SET code = 'c' WHERE id = 2 RETURNING *""",
    """INSERT INTO coded VALUES (3, 'zz')""",
    """DELETE FROM codes WHERE code = 'a' RETURNING *""",
    """INSERT INTO measurements VALUES (2, '2026-05-05', 2.5) RETURNING *""",
    """INSERT INTO measurements VALUES (3, '2030-01-01', 1)""",
    """UPDATE measurements SET v = v * 2 RETURNING *""",
]


@pytest.fixture
def shapes(plain_db: str, layer_db: str) -> Iterator[Pair]:
    with (
        psycopg.connect(plain_db, autocommit=True) as plain,
        psycopg.connect(layer_db, autocommit=True) as cow,
    ):
        plain.execute(SCHEMA)
        cow.execute(SCHEMA.replace('CREATE SCHEMA "Sales Dept";', ""))
        for conn in (plain, cow):
            conn.execute("""SET search_path = "Sales Dept", public""")
        yield Pair(plain, cow)


@pytest.fixture
def layer_db(create_database: object, layer_template: str) -> str:  # type: ignore[override]
    # The schema must exist before install so that it is enabled: clone, create it, install on both schemas.
    import asyncio

    import asyncpg

    from migrations import install_layer

    dsn: str = create_database(template=layer_template)  # type: ignore[operator]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "Sales Dept"')

    async def install() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await install_layer(conn, ["public", "Sales Dept"])
        finally:
            await conn.close()

    asyncio.run(install())
    return dsn


def test_shapes_behave_like_the_plain_tables(shapes: Pair) -> None:
    enabled = shapes.cow.execute("SELECT table_schema, table_name, pk_columns FROM cow.tables").fetchall()
    assert ("Sales Dept", "Line Items", ["Order No", "Line"]) in enabled
    assert ("public", "measurements", ["id", "day"]) in enabled
    shapes.cow.execute("SELECT cow.use_session('shapes')")
    assert shapes.cow.execute("SHOW search_path").fetchone() == (
        '"cow_overlay_Sales Dept", "Sales Dept", cow_overlay_public, public',
    )
    for sql in STATEMENTS:
        shapes.both(
            sql, any_order=True
        )  # e.g. the 2 rows of UPDATE measurements ... RETURNING, in scan order
    shapes.same_table('"Line Items"', '"Order No", "Line"')
    shapes.same_table("coded")
    shapes.same_table("codes", "code")
    shapes.same_table("measurements", "id")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        shapes.cow.execute("INSERT INTO public.measurements_2026 VALUES (9, '2026-02-02', 1)")
    # A partition created by app DDL while the session is open: the event trigger regenerates the check.
    for conn in (shapes.plain, shapes.cow):
        conn.execute(
            "CREATE TABLE public.measurements_2030 PARTITION OF public.measurements"
            " FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')"
        )
    shapes.both("INSERT INTO measurements VALUES (3, '2030-01-01', 1) RETURNING *")
    shapes.cow.execute("SELECT cow.use_session(NULL)")
    assert shapes.cow.execute('SELECT count(*) FROM "Line Items"').fetchone() == (2,)
    shapes.cow.execute("SELECT cow.commit_session('shapes')")
    shapes.same_table('"Line Items"', '"Order No", "Line"')
    shapes.same_table("coded")
    shapes.same_table("measurements", "id")
