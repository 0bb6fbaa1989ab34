"""Which anti join the planner picks for the overlay view's ``SELECT *``: the layer's view against a copy
with the old filter ``u._cow_k = 1`` (docs/layer.md, "Row order"), side by side over a grid of table sizes.

A Hash Right Anti Join hashes the view's append and returns the rows in hash order; every other method
returns them in the append's order (the base table's, then the session's). For each combination of base
rows, rows the session inserted, rows of other sessions and statistics (none, the changes table's only,
both) it builds a fresh table (app DDL: the layer enables it), writes the session's rows through the view,
and prints the anti join of each plan; then the count of right anti joins per shape.

    .venv/bin/python bench/anti_join_choice.py [--dsn DSN]
"""

from __future__ import annotations

import itertools
import json
from typing import Any

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

from migrations import install_layer

BASE_ROWS = (0, 5, 50, 1000, 20000)
SESSION_ROWS = (0, 3, 30, 500)
OTHER_ROWS = (0, 2000)
STATISTICS = ("none", "changes", "both")

# The view before the _cow_b key, over the same tables (the binding gate left out: it is not in the join).
OLD_VIEW = """
CREATE VIEW old_shape.t AS SELECT u.id, u.name FROM (
    SELECT 1 AS _cow_k, b.id, b.name, coalesce(current_setting('cow.session_id', true), '') AS _cow_s,
           NULL::boolean AS _cow_cur, NULL::boolean AS _cow_del FROM public.t b
    UNION ALL SELECT 2, c.id, c.name, c._cow_session, c._cow_current, c._cow_deleted
      FROM cow_changes.{ch} c) u
WHERE u._cow_s = coalesce(current_setting('cow.session_id', true), '') AND CASE u._cow_k WHEN 1 THEN true
      ELSE current_setting('cow.session_id', true) <> '' AND u._cow_cur AND NOT u._cow_del END
  AND NOT EXISTS (SELECT 1 FROM cow_changes.{ch} x WHERE u._cow_k = 1
                  AND x._cow_session = current_setting('cow.session_id', true) AND x._cow_current
                  AND x.id = u.id)
"""


def anti_joins(plan: dict[str, Any]) -> list[str]:
    found = [f"{plan['Node Type']} {plan['Join Type']}"] if "Anti" in plan.get("Join Type", "") else []
    for child in plan.get("Plans", []):
        found += anti_joins(child)
    return found


async def build(conn: asyncpg.Connection, base: int, mine: int, others: int, stats: str) -> None:
    await conn.execute("SELECT cow.use_session(NULL)")
    await conn.execute("DROP VIEW IF EXISTS old_shape.t; DROP TABLE IF EXISTS public.t")
    await conn.execute("CREATE TABLE public.t (id serial PRIMARY KEY, name text)")
    await conn.execute("INSERT INTO public.t (name) SELECT 'n' || g FROM generate_series(1, $1) g", base)
    ch = await conn.fetchval("SELECT changes_table FROM cow.registry WHERE table_name = 't'")
    await conn.execute(OLD_VIEW.format(ch=ch))
    for i in range(10 if others else 0):
        await conn.execute("SELECT cow.use_session($1)", f"other{i}")
        await conn.execute("INSERT INTO t (name) SELECT 'o' FROM generate_series(1, $1)", others // 10)
    await conn.execute("SELECT cow.use_session('me')")
    await conn.execute("INSERT INTO t (name) SELECT 's' || g FROM generate_series(1, $1) g", mine)
    if stats in ("changes", "both"):
        await conn.execute(f"ANALYZE cow_changes.{ch}")
    if stats == "both":
        await conn.execute("ANALYZE public.t")


async def main() -> None:
    args = common.argument_parser(__doc__, 0).parse_args()
    with common.server(args.dsn, "128MB") as admin:
        async with common.scratch_database(admin, "cow_bench_anti_join") as dsn:
            conn = await asyncpg.connect(dsn)
            try:
                await install_layer(conn)
                await conn.execute("CREATE SCHEMA old_shape")
                right = {"layer": 0, "old": 0}
                grid = list(itertools.product(BASE_ROWS, SESSION_ROWS, OTHER_ROWS, STATISTICS))
                for base, mine, others, stats in grid:
                    await build(conn, base, mine, others, stats)
                    row = []
                    for shape, view in (("layer", "t"), ("old", "old_shape.t")):
                        plan = json.loads(await conn.fetchval(f"EXPLAIN (FORMAT JSON) SELECT * FROM {view}"))
                        joins = ", ".join(anti_joins(plan[0]["Plan"])) or "-"
                        right[shape] += "Right" in joins
                        row.append(f"{shape}: {joins}")
                    print(
                        f"base {base:>5}, session {mine:>3}, others {others:>4}, stats {stats:<7} | "
                        + " | ".join(row)
                    )
                print(
                    f"right anti joins in {len(grid)} combinations: layer {right['layer']},"
                    f" old {right['old']}"
                )
                version = await conn.fetchval("SHOW server_version")
                common.log(f"PostgreSQL {version}")
            finally:
                await conn.close()


if __name__ == "__main__":
    raise SystemExit(common.run_main("bench/anti_join_choice.py", main()))
