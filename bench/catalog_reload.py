"""What a catalog reload costs after one table's DDL, by the number of CoW tables: a full read
(``CATALOG_QUERY``) against the incremental one (``CATALOG_DELTA_QUERY`` given the stamps held).

    .venv/bin/python bench/catalog_reload.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
        [--tables 200,800] [--rounds 5]

For each table count, a database of small keyed tables with the layer installed (bench/session_start.py's),
then per round one ``ALTER TABLE … ADD COLUMN`` and both reads of the new state, alternating which goes first:
the server's time (query round trip) and the proxy's decoding (``Catalog.from_rows``), medians in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

from proxy.sql import CATALOG_DELTA_QUERY, CATALOG_QUERY, Catalog

session_start = common.sibling("session_start")


def timed_read(conn: psycopg.Connection[tuple[str | None, ...]], held: Catalog | None) -> tuple[float, float]:
    """(query ms, decode ms) of one read: full when ``held`` is None, else the delta from it."""
    started = time.perf_counter()
    if held is None:
        rows = conn.execute(CATALOG_QUERY).fetchall()
    else:
        stamps = "{" + ",".join(held.by_stamp) + "}"
        # The delta's $1 is the proxy's bound parameter: sent as such, not through psycopg's placeholders.
        result = conn.pgconn.exec_params(CATALOG_DELTA_QUERY.encode(), [stamps.encode()])
        rows = [
            tuple(
                None if v is None else v.decode()
                for v in (result.get_value(i, j) for j in range(result.nfields))
            )
            for i in range(result.ntuples)
        ]
    queried = time.perf_counter()
    Catalog.from_rows(rows, held)
    return 1000 * (queried - started), 1000 * (time.perf_counter() - queried)


def measure(db: str, rounds: int) -> dict[str, list[tuple[float, float]]]:
    found: dict[str, list[tuple[float, float]]] = {"full": [], "delta": []}
    with psycopg.connect(db, autocommit=True) as conn:
        held = Catalog.from_rows(conn.execute(CATALOG_QUERY).fetchall())
        for n in range(rounds):
            conn.execute(f"ALTER TABLE t{n} ADD COLUMN bench_{n} int")
            order = ("full", "delta") if n % 2 == 0 else ("delta", "full")
            for name in order:
                found[name].append(timed_read(conn, None if name == "full" else held))
            held = Catalog.from_rows(conn.execute(CATALOG_QUERY).fetchall())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="PostgreSQL (superuser)")
    parser.add_argument("--tables", default="200,800")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("tables  read   query ms  decode ms  (medians)")
    for tables in (int(t) for t in args.tables.split(",")):
        db = session_start.make_database(args.dsn, f"cowbench_reload_{tables}", tables)
        try:
            for name, times in measure(db, args.rounds).items():
                query = statistics.median(q for q, _ in times)
                decode = statistics.median(d for _, d in times)
                print(f"{tables:>6}  {name:<5}  {query:>8.1f}  {decode:>9.1f}")
        finally:
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS cowbench_reload_{tables} WITH (FORCE)")


if __name__ == "__main__":
    main()
