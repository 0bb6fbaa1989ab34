"""How many of the regression attacks a proxy contains, as the superuser and as the non-superuser owner.

    .venv/bin/python -m tests.containment.report --dsn postgresql://postgres@127.0.0.1:5432/postgres \
        [--checkout PATH]  # another checkout's proxy and layer (e.g. main before a change)

Each sequence of ``attacks.REGRESSIONS`` runs on its own connection (tagged at startup) on a fresh clone of
a prepared database, through ``cowproxy serve`` of the checkout; prints the contained count per role and
each escape with the invariant it broke. The layer installed is the checkout's too.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.containment.attacks import REGRESSIONS
from tests.containment.test_containment import attack
from tests.containment.world import (
    OWNER,
    ROOT,
    Violation,
    World,
    cowproxy_serve,
    drop_database,
    prepare_database,
    with_database,
)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", required=True, help="a superuser's DSN on the server to attack")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the cowproxy checkout to run")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    if checkout != ROOT:
        # The layer is installed from the checkout too (migrations is imported only when it installs).
        sys.path.insert(0, str(checkout))
        assert "migrations" not in sys.modules
    parts = urlsplit(args.dsn)
    template = f"cowc_report_{os.getpid()}"
    drop_database(args.dsn, template)
    prepare_database(args.dsn, template)
    counter = itertools.count()
    try:
        with cowproxy_serve(f"{parts.hostname}:{parts.port or 5432}", checkout) as port:
            for role, user in (("superuser", parts.username or "postgres"), ("owner", OWNER)):
                escapes: list[str] = []
                for cls, startup, steps in REGRESSIONS:
                    name = f"{template}_{next(counter)}"
                    with psycopg.connect(args.dsn, autocommit=True) as conn:
                        conn.execute(
                            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                                sql.Identifier(name), sql.Identifier(template)
                            )
                        )
                    try:
                        attack(World(with_database(args.dsn, name), port, user), startup, steps)
                    except Violation as exc:
                        sequence = " / ".join(s.sql for s in steps)
                        escapes.append(f"  [{cls}] {startup} {sequence}\n      -> {exc}")
                    finally:
                        drop_database(args.dsn, name)
                contained = len(REGRESSIONS) - len(escapes)
                print(f"{role}: {contained}/{len(REGRESSIONS)} contained")
                print("\n".join(escapes))
    finally:
        drop_database(args.dsn, template)
    return 0


if __name__ == "__main__":
    sys.exit(main())
