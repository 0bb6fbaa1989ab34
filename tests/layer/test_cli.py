"""The layer's CLI commands, and one clear line + non-zero exit for every kind of bad input."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Callable

import psycopg
import pytest

from cowproxy.main import main
from migrations import migrations, repeatables
from migrations.cli import _Progress
from tests.fix_layer import SAMPLE_DATA, SAMPLE_SCHEMA


def cli(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cowproxy`` in-process (a subprocess costs ~1 s of imports); same exit code and output."""
    argv = [*args] + (["--dsn", dsn] if dsn is not None else [])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def one_error_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cowproxy: error:"), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr


def snapshot(dsn: str) -> list[object]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT (SELECT json_agg(s ORDER BY session_id) FROM cow.sessions s),"
            " (SELECT json_agg(c ORDER BY id) FROM public.customers c),"
            " (SELECT count(*) FROM cow_changes.t1) + (SELECT count(*) FROM cow_changes.t2)"
        ).fetchall()


def test_install_status_uninstall(create_database: Callable[..., str]) -> None:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SAMPLE_SCHEMA)
        conn.execute(SAMPLE_DATA)
    assert "not installed" in cli("status", dsn=dsn).stdout
    result = cli("install", "--exclude", "nopk", dsn=dsn)
    assert result.returncode == 0 and "installed" in result.stdout and result.stderr == ""
    again = cli("install", dsn=dsn)
    assert again.returncode == 0 and "up to date" in again.stdout and again.stderr == ""  # excludes persist
    status = json.loads(cli("status", "--format", "json", dsn=dsn).stdout)
    assert status["installed"] and status["schemas"] == ["public"]
    assert [t["table_name"] for t in status["tables"]] == ["customers", "orders"]
    assert status["migrations"] == [m.version for m in migrations()]
    shipped = [(r.name, True) for r in repeatables()]
    assert [(r["name"], r["current"]) for r in status["repeatables"]] == shipped
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE cow.repeatables SET checksum = 'old' WHERE name = '70_commit.sql'")
        conn.execute("INSERT INTO cow.repeatables (name, checksum) VALUES ('05_gone.sql', 'x')")
    text = cli("status", dsn=dsn).stdout
    assert "functions/70_commit.sql  sha256 old  changed: install applies it" in text
    assert "functions/05_gone.sql  sha256 x  no longer shipped" in text
    assert "functions/10_core.sql" in text and text.count("  current") == len(repeatables()) - 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("DELETE FROM orders WHERE id = 1")
    one_error_line(cli("uninstall", dsn=dsn), "discard-sessions")
    assert cli("uninstall", "--discard-sessions", dsn=dsn).returncode == 0
    one_error_line(cli("uninstall", dsn=dsn), "not installed")


def test_install_on_several_connections_prints_one_summary_line(create_database: Callable[..., str]) -> None:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "\n".join(
                f"CREATE TABLE t{i} (id int PRIMARY KEY"
                + (f", up int REFERENCES t{i - 1} (id));" if i % 5 else ");")
                for i in range(30)
            )
        )
    result = cli("install", "--jobs", "3", dsn=dsn)
    assert result.returncode == 0 and result.stderr == ""  # not a terminal: no progress bar
    summary = result.stdout.strip().splitlines()[-2 if "binding secret" in result.stdout else -1]
    assert summary.startswith("CoW enabled on schema(s): public (30 tables enabled or regenerated in ")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cow.registry").fetchone() == (30,)
        assert conn.execute("SELECT count(*) FROM cow._pending_tables(false)").fetchone() == (0,)
    for bad in ("0", "x", "99"):
        usage = cli("install", "--jobs", bad, dsn=dsn)
        assert usage.returncode == 2 and "--jobs: expected a number of connections from 1" in usage.stderr


def test_install_progress_bar_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = _Progress(stream)
    for done in (0, 10, 25):
        progress(done, 25)
    assert stream.getvalue().split("\r")[1:] == [
        "enabling tables [..............................] 0/25",
        "enabling tables [############..................] 10/25",
        "enabling tables [##############################] 25/25\n",
    ]
    assert progress.summary().startswith("25 tables enabled or regenerated in ")
    quiet = io.StringIO()
    _Progress(quiet)(10, 25)
    assert quiet.getvalue() == ""


def test_session_commands(layer_db: str) -> None:
    r = cli(
        "session",
        "create",
        "gt1",
        "--kind",
        "ground_truth",
        "--label",
        "L",
        "--metadata",
        '{"a": 1}',
        dsn=layer_db,
    )
    assert r.returncode == 0, r.stderr
    r = cli("session", "create", "ag1", "--gt", "gt1", "--model", "m", "--format", "json", dsn=layer_db)
    assert json.loads(r.stdout)["gt_session"] == "gt1"
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('ag1', 'op1')")
        conn.execute("UPDATE customers SET name = 'Robert' WHERE id = 2")
        conn.execute("SELECT cow.use_operation('op2')")
        conn.execute("INSERT INTO orders (id, customer_id, ref) VALUES (9, 2, 'R-9')")
        conn.execute("DELETE FROM orders WHERE id = 4")
    listed = json.loads(cli("session", "list", "--format", "json", dsn=layer_db).stdout)
    assert [(s["session_id"], s["changes"]) for s in listed] == [("gt1", 0), ("ag1", 3)]
    text = cli("session", "diff", "ag1", dsn=layer_db).stdout
    assert 'name: "Bob" -> "Robert"' in text and "operation op2" in text and "deleted" in text
    diff = json.loads(cli("session", "diff", "ag1", "--format", "json", dsn=layer_db).stdout)
    assert [o["operation_id"] for o in diff["operations"]] == ["op1", "op2"]
    assert diff["tables"]["public.customers"]["updated"][0]["changed"] == {"name": ["Bob", "Robert"]}
    shown = json.loads(cli("session", "show", "ag1", "--format", "json", dsn=layer_db).stdout)
    assert (shown["operations"], shown["status"]) == (2, "open")
    r = cli("session", "commit", "ag1", "--ops", "op2", dsn=layer_db)
    # op2's new order references customer 2, which op1 updated: op1 comes along.
    assert r.returncode == 0 and "pulled in as dependencies: op1" in r.stdout, r.stderr
    one_error_line(cli("session", "commit", "ag1", dsn=layer_db), "session ag1 is committed")
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('ag2', 'op1')")
        conn.execute("UPDATE customers SET name = 'C' WHERE id = 3")
    r = cli("session", "commit", "ag2", "--format", "json", dsn=layer_db)
    assert json.loads(r.stdout)["status"] == "committed"
    assert cli("session", "discard", "gt1", dsn=layer_db).returncode == 0
    with psycopg.connect(layer_db) as conn:
        assert conn.execute("SELECT name FROM public.customers WHERE id = 2").fetchone() == ("Robert",)
        assert conn.execute("SELECT count(*) FROM public.orders").fetchone() == (4,)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("session", "show", "nope"), "unknown session nope"),
        (("session", "show", "bad id!"), "invalid session id"),
        (("session", "diff", "x" * 200), "invalid session id"),
        (("session", "discard", "nope"), "unknown session"),
        (("session", "commit", "nope"), "unknown session"),
        (("session", "create", "a;b"), "invalid session id"),
        (("session", "create", "m", "--metadata", "[1]"), "JSON object"),
        (("session", "create", "m", "--metadata", "{"), "not JSON"),
        (("install", "--schema", "nosuch"), "does not exist"),
        (("install", "--exclude", "nosuch"), "no such table"),
    ],
)
def test_bad_input_changes_nothing(layer_db: str, args: tuple[str, ...], needle: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s1')")
        conn.execute("UPDATE customers SET score = 1 WHERE id = 1")
    before = snapshot(layer_db)
    one_error_line(cli(*args, dsn=layer_db), needle)
    assert snapshot(layer_db) == before


def test_commit_conflict_and_unknown_operation(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s1', 'o1')")
        conn.execute("UPDATE customers SET score = 1 WHERE id = 1")
        conn.execute("SELECT cow.use_session(NULL)")
        conn.execute("UPDATE customers SET score = 2 WHERE id = 1")
    before = snapshot(layer_db)
    one_error_line(cli("session", "commit", "s1", "--ops", "o9", dsn=layer_db), "no operation o9")
    one_error_line(cli("session", "commit", "s1", dsn=layer_db), "changed in base")
    assert snapshot(layer_db) == before
    assert cli("session", "commit", "s1", "--on-conflict", "overwrite", dsn=layer_db).returncode == 0


def test_unreachable_and_missing_databases(layer_db: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "cowproxy", "status", "--dsn", "postgresql://postgres@127.0.0.1:1/x"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    one_error_line(r, "cannot connect")
    one_error_line(cli("session", "list", dsn=layer_db.rsplit("/", 1)[0] + "/no_such_db"), "does not exist")
    one_error_line(cli("status", dsn="mysql://x"), "bad --dsn")
    r = subprocess.run(
        [sys.executable, "-m", "cowproxy", "status"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    one_error_line(r, "no database given")


def test_session_commands_on_a_database_without_the_layer(empty_db: str) -> None:
    one_error_line(cli("session", "list", dsn=empty_db), "not installed")


def test_install_without_permission_is_one_line(create_database: Callable[..., str]) -> None:
    dsn = create_database()
    role = "cow_cli_unpriv"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        result = cli("install", dsn=dsn.replace("postgres@", f"{role}@", 1))
        one_error_line(result, "superuser")
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT to_regnamespace('cow')").fetchone() == (None,)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")
