"""Cost of proxy.sql per statement, side by side with pglast's own calls, in one run.

    .venv/bin/python bench/sql_analyze.py [--n 2000] [--baseline REF]

cold = a text the cache has not seen (a fresh literal each call); warm = the same text again. Each row is
the best of 5 rounds of n/5 calls. ``--baseline REF``: the same measurement of proxy.sql as of git ref REF
(a temporary checkout of it, on the import path of an interpreter of its own) and of this checkout, in
turns, 3 times each; each row is the best of the 3, with the ratio this / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

# Files in bench/ are named like the packages they measure: keep this folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import pglast  # noqa: E402
from pglast import parser  # noqa: E402

from proxy.sql import Analyzer, Catalog, read_comment_tags, strip_edge_comments  # noqa: E402
from proxy.sql.rewrites import introspection  # noqa: E402


def _catalog(*, keyed: bool = False) -> Catalog:
    """One CoW table ``orders``; ``keyed``: with the layer's key and changes table, as the catalog query
    reports an installed table (what the count, key-read and row-lock rewrites need)."""
    doc: dict[str, object] = {
        "pk": ["id"],
        "columns": [
            {"name": c, "type": t, "generated": False, "identity": False}
            for c, t in (("id", "integer"), ("name", "text"), ("total", "numeric"))
        ],
        "unique": [
            {
                "name": "orders_pkey",
                "columns": ["id"],
                "constraint": True,
                "nulls_not_distinct": False,
                "partial": False,
                "expressions": False,
            }
        ],
        "referenced_by": [],
        **({"key": ["id"], "changes": "t1", "indexed": ["id"]} if keyed else {}),
    }
    return Catalog.from_rows([("public", "orders", "cow_public", json.dumps(doc))])


SELECT = (
    "SELECT o.id, o.name, o.total FROM orders o JOIN users u ON u.id = o.user_id WHERE o.id = {i} LIMIT 10"
)
UPDATE = "UPDATE orders SET total = total + 1 WHERE id = {i}"
QUALIFIED = "SELECT * FROM public.orders WHERE id = {i}"
UPSERT = "INSERT INTO orders (id, name) VALUES ({i}, $1) ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name"
GROUP_BY_PK = (
    'SELECT "orders"."id", "orders"."name", COUNT("users"."id") AS "n" FROM "orders" LEFT OUTER JOIN "users" '
    'ON ("orders"."id" = "users"."order_id") WHERE "orders"."id" > {i} GROUP BY "orders"."id"'
)
# A statement with a word of the policy's (proxy/sql/policy.py FAST_PATH_WORDS): parsed, no longer fast.
NEXTVAL = "SELECT nextval('orders_id_seq'), {i}"
DO_BLOCK = "DO $$BEGIN UPDATE orders SET total = total + 1 WHERE id = {i}; END$$"
GROUP_BY_OTHER = "SELECT u.kind, count(*) FROM users u WHERE u.id > {i} GROUP BY u.kind"
PLAIN = "SELECT o.id, o.name, o.total FROM orders o WHERE o.id = {i} LIMIT 10"
CATALOG_QUESTION = (
    "SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relkind = 'r' AND c.oid > {i} "
    "AND pg_catalog.pg_table_is_visible(c.oid)"
)
# Rewrites that copy the client's expressions (into each part of a split count, a key read's two branches,
# a locked read's key query): Django's .count() and .select_for_update() shapes, on the keyed catalog.
COUNT_WHERE = (
    'SELECT COUNT(*) AS "__count" FROM "orders" WHERE ("orders"."name" = \'n{i}\' AND "orders"."total" > 3 '
    'AND "orders"."id" IN (1, 2, 3, {i}))'
)
KEY_READ = (
    'SELECT "orders"."id", "orders"."name" FROM "orders" WHERE "orders"."id" = $1 AND "orders"."total" > {i}'
)
FOR_UPDATE = (
    'SELECT "orders"."id" FROM "orders" '
    'WHERE ("orders"."name" = \'n{i}\' AND "orders"."total" > 3) FOR UPDATE'
)
TAGGED = "/*cow_session='s-1',cow_operation='op-{i}'*/ SELECT 1"
# Django's inlined INSERT (its literals change with every row): parsed, no fast path.
INSERT_RETURNING = 'INSERT INTO "orders" ("name", "total") VALUES (\'n{i}\', {i}) RETURNING "orders"."id"'


def per_call(fn: Callable[[int], object], n: int, repeat: int = 5) -> float:
    """Best of ``repeat`` rounds of ``n // repeat`` calls (the machine is shared: the minimum is the
    least disturbed); ``fn`` gets a call number unique across rounds, for cold-cache texts."""
    rounds = max(1, n // repeat)
    best = float("inf")
    for r in range(repeat):
        start = time.perf_counter()
        for i in range(r * rounds, (r + 1) * rounds):
            fn(i)
        best = min(best, (time.perf_counter() - start) / rounds)
    return best * 1e6


def measure(n: int) -> list[tuple[str, float]]:
    catalog, keyed = _catalog(), _catalog(keyed=True)
    rows: list[tuple[str, float]] = []
    for label, template, cat in (
        ("SELECT (fast path)", SELECT, catalog),
        ("SELECT, no session word (fast path)", PLAIN, catalog),
        ("catalog question (rewritten)", CATALOG_QUESTION, catalog),
        ("UPDATE (parsed)", UPDATE, catalog),
        ("SELECT public.t (rewritten)", QUALIFIED, catalog),
        ("INSERT ON CONFLICT (rewritten)", UPSERT, catalog),
        ("GROUP BY pk (rewritten)", GROUP_BY_PK, catalog),
        ("GROUP BY, no CoW table (JSON walk)", GROUP_BY_OTHER, catalog),
        ("SELECT nextval (a policy word: parsed)", NEXTVAL, catalog),
        ("DO block (PL/pgSQL walked)", DO_BLOCK, catalog),
        ("count(*) WHERE (split: copies)", COUNT_WHERE, keyed),
        ("key read (rewritten: copies)", KEY_READ, keyed),
        ("FOR UPDATE (rewritten: copies)", FOR_UPDATE, keyed),
    ):
        analyzer = Analyzer(cache_size=4 * n)
        rows.append(
            (
                f"analyze cold   {label}",
                per_call(lambda i, t=template, a=analyzer, c=cat: a.analyze(t.format(i=i), c, True), n),
            )
        )
        rows.append(
            (
                f"analyze warm   {label}",
                per_call(lambda i, t=template, a=analyzer, c=cat: a.analyze(t.format(i=0), c, True), n),
            )
        )
    # What the relay does with a cold text of a tagged connection that goes out as it is: the analysis, then
    # the shape's proof for the C relay's decision (Decisions.decide); a text of a proven shape comes after.
    for label, template in (("UPDATE", UPDATE), ("INSERT RETURNING", INSERT_RETURNING)):
        analyzer = Analyzer(cache_size=4 * n)

        def decided(i: int, t: str = template, a: Analyzer = analyzer) -> object:
            sql = t.format(i=i)
            return a.shape(sql, catalog, a.analyze(sql, catalog, True))

        rows.append((f"analyze+shape cold {label} (Decisions.decide)", per_call(decided, n)))
    rows.append(("pglast.parse_sql      SELECT", per_call(lambda i: pglast.parse_sql(SELECT.format(i=i)), n)))
    rows.append(
        ("pglast fingerprint    SELECT", per_call(lambda i: parser.fingerprint(SELECT.format(i=i)), n))
    )
    rows.append(("pglast scan           SELECT", per_call(lambda i: parser.scan(SELECT.format(i=i)), n)))
    rows.append(("pglast split          SELECT", per_call(lambda i: parser.split(SELECT.format(i=i)), n)))
    rows.append(
        ("read_comment_tags     tagged", per_call(lambda i: read_comment_tags(TAGGED.format(i=i)), n))
    )
    rows.append(
        ("strip_edge_comments   tagged", per_call(lambda i: strip_edge_comments(TAGGED.format(i=i)), n))
    )
    lowered = PLAIN.format(i=1).lower()
    rows.append(
        (
            "introspection words alone (fast path)",
            per_call(lambda i: any(w in lowered for w in introspection.WORDS), n),
        )
    )
    rows.append(("str.format only (baseline)", per_call(lambda i: SELECT.format(i=i), n)))
    return rows


def measure_checkout(path: str, n: int) -> list[tuple[str, float]]:
    """This script's measurement in an interpreter whose ``proxy`` is the checkout at ``path``."""
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--n", str(n), "--json"],
        cwd=path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = json.loads(out)
    if os.path.dirname(os.path.dirname(os.path.abspath(found["proxy"]))) != os.path.abspath(path):
        raise SystemExit(f"bench/sql_analyze.py: measured {found['proxy']}, not the checkout {path}")
    return [(label, value) for label, value in found["rows"]]


def side_by_side(ref: str, n: int) -> None:
    sys.path.insert(
        0, _HERE
    )  # only here (it takes the folder off again): its imports are not needed otherwise
    import _common as common

    runs: dict[str, list[list[tuple[str, float]]]] = {"baseline": [], "this": []}
    with common.checkout(ref) as path:
        for _ in range(3):
            runs["baseline"].append(measure_checkout(path, n))
            runs["this"].append(measure_checkout(common.ROOT, n))
    best = {k: {label: min(r[i][1] for r in v) for i, (label, _) in enumerate(v[0])} for k, v in runs.items()}
    width = max(len(label) for label in best["this"])
    print(
        f"{'call':<{width}}  {ref[:12]:>12}  {'this':>8}  this/base   µs/call (n={n}, best of 3 x 5 rounds)"
    )
    for label, value in best["this"].items():
        base = best["baseline"].get(label)
        cells = f"{base:12.1f}  {value:8.1f}  {value / base:9.2f}" if base else f"{'–':>12}  {value:8.1f}"
        print(f"{label:<{width}}  {cells}")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    args.add_argument("--n", type=int, default=2000)
    args.add_argument("--baseline", default=None, help="git ref to measure side by side with this checkout")
    args.add_argument(
        "--json", action="store_true", help=argparse.SUPPRESS
    )  # one checkout's rows, for --baseline
    a = args.parse_args()
    if a.n < 5:
        args.error("--n must be at least 5")
    if a.baseline:
        side_by_side(a.baseline, a.n)
        return
    rows = measure(a.n)
    if a.json:
        import proxy

        print(json.dumps({"proxy": proxy.__file__, "rows": rows}))
        return
    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  µs/call   (n={a.n}, best of 5 rounds)")
    for label, value in rows:
        print(f"{label:<{width}}  {value:8.1f}")


if __name__ == "__main__":
    main()
