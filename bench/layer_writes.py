"""In-session single-row writes of the CoW layer: a baseline layer against this checkout's, side by side.

Two databases on one server are built alike: each holds ``plain.items`` (no layer) and ``public.items`` (the
layer installed on ``public``) of ``--rows`` rows, ``--other-changes`` changes of 100 other sessions and
``--session-changes`` changes of session ``bench``. Database ``a`` gets the layer's migrations as of git ref
``--baseline`` (default ``main``), database ``b`` this checkout's. Variants, one connection each:

- ``plain``   ``plain.items`` in database ``b``;
- ``a``       the overlay view in session ``bench``, baseline layer;
- ``b``       the overlay view in session ``bench``, this checkout's layer.

Operations (asyncpg prepared statements, autocommit, like ``bench/layer.py``): insert of a fresh key, update
and delete of a base row the session has not written yet (the first write of a key: it snapshots the base
row), and ``update again`` of a row the session already changed (retires the previous version). The variants
take turns op by op in a shuffled order over a warm-up round and ``--rounds`` rounds of ``--batch`` ops; the
figure is the median of every single op, and the per-round ratios show the spread. When the server runs on
this machine, the CPU time each variant's backend spent per op (``/proc/<pid>/schedstat``) is reported too:
unlike wall time it does not count waiting for a core that another process holds, nor the client's share.

    .venv/bin/python bench/layer_writes.py [--dsn DSN] [--baseline REF] [--rows 250000] [--rounds 7] [--keep]
        [--fk immediate|deferred] [--role] [--prefix cowwrites]

``--role`` runs the measured connections as a non-superuser role (``SET ROLE`` after joining the session)
with the privileges on ``items`` an application role has: the generated triggers run as that role, so the
changes tables' row-level security (issue 17, migration 0021) applies to their statements, as it does for
the recommended set-up (docs/threat-model.md); a superuser bypasses it.

``--fk`` gives ``items.grp`` a FOREIGN KEY to a 1000-row table ``grps`` (on both sides), checked at the end of
the statement (``immediate``) or ``DEFERRABLE INITIALLY DEFERRED`` at COMMIT (``deferred``, Django's kind).

Without ``--dsn`` an embedded PostgreSQL is started (its ``fsync`` is off, so commits are nearly free);
with ``--dsn`` scratch databases ``cowwrites_<pid>_{a,b}`` are created and dropped at the end (``--keep``
leaves them, for profiling with pgbench; ``--prefix`` names them otherwise).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

import migrations.layer as layer_mod

SESSION = "bench"
ROLE = "cowbench_writer"  # --role: an application's role, no superuser
ROLE_DDL = f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
        CREATE ROLE {ROLE};
    END IF;
END $$
"""
VARIANTS = ("plain", "a", "b")
OPS = {
    "insert 1 row": "INSERT INTO items (id, grp, name) VALUES ($1, 1, 'new')",
    "update 1 row": "UPDATE items SET qty = qty + 1 WHERE id = $1",
    "update again": "UPDATE items SET qty = qty + 1 WHERE id = $1",
    "delete 1 row": "DELETE FROM items WHERE id = $1",
}


@dataclass(frozen=True)
class Config:
    rows: int
    dsn: str | None
    baseline: str
    rounds: int
    batch: int
    session_changes: int
    other_changes: int
    keep: bool
    seed: int
    fk: str = "none"
    role: bool = False
    prefix: str = "cowwrites"


def parse_args(argv: list[str] | None = None) -> Config:
    p = common.argument_parser(__doc__, rows=250_000)
    p.add_argument("--baseline", default="main", help="git ref whose migrations build database a")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", type=int, default=300)
    p.add_argument("--session-changes", type=int, default=1_000)
    p.add_argument("--other-changes", type=int, default=100_000)
    p.add_argument("--keep", action="store_true", help="keep the databases (with --dsn)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fk", choices=("none", "immediate", "deferred"), default="none")
    p.add_argument("--role", action="store_true", help=f"measure as the non-superuser role {ROLE}")
    p.add_argument("--prefix", default="cowwrites", help="scratch databases' names: PREFIX_<pid>_a, _b")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.batch < 1:
        p.error("--rounds and --batch must be positive")
    need = a.session_changes + a.other_changes + 3 * len(VARIANTS) * (a.rounds + 1) * a.batch
    if a.rows < 2 * need:
        p.error(f"--rows must be at least {2 * need} for these counts")
    if a.keep and not a.dsn:
        p.error("--keep needs --dsn")
    return Config(
        a.rows,
        a.dsn,
        a.baseline,
        a.rounds,
        a.batch,
        a.session_changes,
        a.other_changes,
        a.keep,
        a.seed,
        a.fk,
        a.role,
        a.prefix,
    )


class Plan:
    """The keys of every write: the session's own changes, and per variant and round the measured ones."""

    def __init__(self, cfg: Config, rng: random.Random) -> None:
        n = cfg.rows
        k = cfg.session_changes
        # The measured keys and the session's changes: the lower half; other sessions write the upper one.
        lower = rng.sample(range(1, n // 2), k + 3 * len(VARIANTS) * (cfg.rounds + 1) * cfg.batch)
        own, pool = lower[:k], lower[k:]
        self.session_changes = common.split_changes(own, n)
        self.writes: dict[tuple[str, int], dict[str, list[int]]] = {}
        fresh = 2 * n + 1
        for v in VARIANTS:
            for r in range(cfg.rounds + 1):
                upd = [pool.pop() for _ in range(cfg.batch)]
                self.writes[(v, r)] = {
                    "insert 1 row": list(range(fresh, fresh + cfg.batch)),
                    "update 1 row": upd,
                    # The same keys again, after the round's first updates: the session's second write.
                    "update again": list(upd),
                    "delete 1 row": [pool.pop() for _ in range(cfg.batch)],
                }
                fresh += cfg.batch


async def build(dsn: str, cfg: Config, plan: Plan, files: common.Layer) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await common.create_items(conn, cfg.rows)
        if cfg.fk != "none":
            deferrable = " DEFERRABLE INITIALLY DEFERRED" if cfg.fk == "deferred" else ""
            for schema in ("public", "plain"):
                await conn.execute(f"CREATE TABLE {schema}.grps (id int PRIMARY KEY)")
                await conn.execute(f"INSERT INTO {schema}.grps SELECT generate_series(0, 999)")
                ref = f"REFERENCES {schema}.grps (id){deferrable}"
                await conn.execute(f"ALTER TABLE {schema}.items ADD FOREIGN KEY (grp) {ref}")
        if cfg.role:
            # Before the install: the overlay view's privileges mirror the table's.
            await conn.execute(ROLE_DDL)
            for schema in ("public", "plain"):
                await conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {ROLE}")
                await conn.execute(
                    f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {ROLE}"
                )
        with common.installed_layer(files):
            await layer_mod.install_layer(conn, schemas=("public",))
        await common.write_other_sessions(conn, cfg.rows, 100, cfg.other_changes // 100)
        await common.write_session(conn, SESSION, plan.session_changes)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


Samples = dict[tuple[str, str], list[list[float]]]


async def measure(dsns: dict[str, str], cfg: Config, plan: Plan) -> tuple[Samples, Samples]:
    """Wall ms of every op, and the backend's CPU ms per op per batch (empty when not measurable)."""
    rng = random.Random(cfg.seed)
    conns: dict[str, asyncpg.Connection] = {}
    pids: dict[str, int] = {}
    for v in VARIANTS:
        conns[v] = await asyncpg.connect(dsns["b" if v == "plain" else v], server_settings={"jit": "off"})
        await conns[v].execute(
            "SET search_path = plain" if v == "plain" else f"SELECT cow.use_session('{SESSION}')"
        )
        if cfg.role:
            await conns[v].execute(f"SET ROLE {ROLE}")
        pids[v] = await conns[v].fetchval("SELECT pg_backend_pid()")
    local = all(common.cpu_ns(pid) is not None for pid in pids.values())
    samples: Samples = {(op, v): [] for op in OPS for v in VARIANTS}
    cpu: Samples = {(op, v): [] for op in OPS for v in VARIANTS} if local else {}
    try:
        stmts = {op: {v: await conns[v].prepare(sql) for v in VARIANTS} for op, sql in OPS.items()}
        for r in range(cfg.rounds + 1):
            t0 = time.perf_counter()
            for op in OPS:
                times: dict[str, list[float]] = {v: [] for v in VARIANTS}
                spent = dict.fromkeys(VARIANTS, 0)
                order = list(VARIANTS)
                for i in range(cfg.batch):
                    rng.shuffle(order)
                    for v in order:
                        key = plan.writes[(v, r)][op][i]
                        c0 = common.cpu_ns(pids[v]) if local else 0
                        t1 = time.perf_counter()
                        await stmts[op][v].fetch(key)
                        times[v].append((time.perf_counter() - t1) * 1000)
                        if local:
                            spent[v] += (common.cpu_ns(pids[v]) or 0) - (c0 or 0)
                if r:  # round 0 warms up (caches, plans, the trigger functions' compilation)
                    for v in VARIANTS:
                        samples[(op, v)].append(times[v])
                        if local:
                            cpu[(op, v)].append([spent[v] / cfg.batch / 1e6])
            common.log_round(r, cfg.rounds, t0)
    finally:
        for c in conns.values():
            await c.close()
    return samples, cpu


def report(cfg: Config, samples: Samples, cpu: Samples, version: str) -> list[str]:
    lines = [
        f"PostgreSQL {version}; {cfg.rows} rows; session {SESSION} holds {cfg.session_changes} changes, "
        f"100 other sessions {cfg.other_changes}; a = layer at {cfg.baseline}, b = this checkout; "
        f"{cfg.rounds} rounds of {cfg.batch} ops per variant"
        + (f"; as the non-superuser {ROLE}" if cfg.role else "; as a superuser"),
        "",
        "| operation | plain ms | a ms | b ms | a × | b × | b / a | per-round a × | per-round b × |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for op in OPS:
        med = {v: statistics.median(x for batch in samples[(op, v)] for x in batch) for v in VARIANTS}
        rounds = {v: [statistics.median(batch) for batch in samples[(op, v)]] for v in VARIANTS}
        spread = []
        for v in ("a", "b"):
            per = [x / p for x, p in zip(rounds[v], rounds["plain"], strict=True)]
            spread.append(f"{min(per):.2f}–{max(per):.2f}")
        lines.append(
            f"| {op} | {med['plain']:.3f} | {med['a']:.3f} | {med['b']:.3f} | {med['a'] / med['plain']:.2f} "
            f"| {med['b'] / med['plain']:.2f} | {med['b'] / med['a']:.2f} | {spread[0]} | {spread[1]} |"
        )
    if cpu:
        lines += [
            "",
            "Backend CPU µs per op (median of the rounds' means; [min–max] over rounds):",
            "",
            "| operation | plain | a | b | a × | b × | b − a |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for op in OPS:
            us = {v: [b[0] * 1000 for b in cpu[(op, v)]] for v in VARIANTS}
            med = {v: statistics.median(us[v]) for v in VARIANTS}
            cells = " | ".join(f"{med[v]:.0f} [{min(us[v]):.0f}–{max(us[v]):.0f}]" for v in VARIANTS)
            lines.append(
                f"| {op} | {cells} | {med['a'] / med['plain']:.2f} | {med['b'] / med['plain']:.2f} "
                f"| {med['b'] - med['a']:+.0f} |"
            )
    return lines


async def main_async(cfg: Config) -> None:
    rng = random.Random(cfg.seed)
    plan = Plan(cfg, rng)
    base = common.baseline_layer(cfg.baseline)
    with common.server(cfg.dsn, "256MB") as admin_dsn:
        names = [f"{cfg.prefix}_{os.getpid()}_{v}" for v in ("a", "b")]
        async with common.scratch_databases(admin_dsn, names, keep=cfg.keep) as (dsn_a, dsn_b):
            dsns = {"a": dsn_a, "b": dsn_b}
            for v, files in (("a", base), ("b", common.this_layer())):
                t0 = time.perf_counter()
                await build(dsns[v], cfg, plan, files)
                common.log(
                    f"built {v} (migrations {[m.version for m in files[0]]},"
                    f" {len(files[1])} repeatable files) in {time.perf_counter() - t0:.1f} s"
                )
            version = await common.fetchval(dsns["b"], "SHOW server_version")
            samples, cpu = await measure(dsns, cfg, plan)
            print("\n".join(report(cfg, samples, cpu, str(version))))
            if cfg.keep:
                print(f"\nkept: {dsns['a']} {dsns['b']}")


def main(argv: list[str] | None = None) -> int:
    return common.run_main("bench/layer_writes.py", main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
