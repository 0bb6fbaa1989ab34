"""Fixtures of the containment suite (tests/containment/): a prepared template database per server, a real
``cowproxy serve`` in front of the server, and a fresh clone of the template (a ``World``) per attack."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from tests.containment.world import (
    OWNER,
    World,
    cowproxy_serve,
    drop_database,
    prepare_database,
    with_database,
)
from tests.fix_db import PgServer

_clones = itertools.count()


@pytest.fixture(scope="session")
def containment_template(pg_server: PgServer) -> Iterator[str]:
    name = f"cowc_template_{os.getpid()}"
    drop_database(pg_server.dsn, name)
    prepare_database(pg_server.dsn, name)
    yield name
    drop_database(pg_server.dsn, name)


@pytest.fixture(scope="session")
def containment_proxy(pg_server: PgServer) -> Iterator[int]:
    with cowproxy_serve(f"{pg_server.host}:{pg_server.port}") as port:
        yield port


@pytest.fixture
def new_world(
    pg_server: PgServer, containment_template: str, containment_proxy: int
) -> Iterator[Callable[[str], World]]:
    """Factory: ``new_world(role)`` -> a World on a fresh clone of the template, dropped afterwards."""
    made: list[str] = []

    def make(role: str) -> World:
        name = f"cowc_{os.getpid()}_{next(_clones)}"
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(containment_template), sql.Identifier(OWNER)
                )
            )
        made.append(name)
        user = pg_server.user if role == "superuser" else OWNER
        return World(with_database(pg_server.dsn, name), containment_proxy, user)

    yield make
    for name in made:
        drop_database(pg_server.dsn, name)
