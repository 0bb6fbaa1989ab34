"""The sample application: a small project tracker with a REST API, modelled on Plane.

A plain asyncio HTTP/1.1 server over an asyncpg pool. It knows nothing about cowproxy: it reads a
``DATABASE_URL`` and runs ordinary SQL, one transaction per write request. Run it on its own with
``python -m demo.app serve --listen 0.0.0.0:8000`` (``DATABASE_URL`` from the environment) and create its
schema and seed data with ``python -m demo.app setup``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import asyncpg

import migrations
from cowproxy import http
from cowproxy.http import read_request
from demo import openapi, seed
from demo.errors import DemoError
from demo.openapi import BY_ID, OPERATIONS, Operation

MAX_BODY = 1 << 20


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Request:
    operation: Operation
    path: dict[str, int]
    query: dict[str, str]
    body: dict[str, Any]


Handler = Callable[[asyncpg.Pool, Request], Awaitable[Any]]
# A pooled connection or a plain one: both run queries the same way.
Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy

_ROUTES: list[tuple[str, re.Pattern[str], Operation]] = [
    (op.method, re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", op.path) + "$"), op)
    for op in OPERATIONS
]

_WORK_ITEM_SELECT = """
SELECT w.id, w.project_id, p.identifier || '-' || w.sequence_id AS key, w.sequence_id, w.name, w.description,
       w.priority, w.state_id, s.name AS state,
       coalesce((SELECT array_agg(a.member_id ORDER BY a.member_id) FROM work_item_assignees a
                 WHERE a.work_item_id = w.id), '{}') AS assignee_ids,
       coalesce((SELECT array_agg(l.label_id ORDER BY l.label_id) FROM work_item_labels l
                 WHERE l.work_item_id = w.id), '{}') AS label_ids,
       w.created_at, w.updated_at
FROM work_items w JOIN projects p ON p.id = w.project_id JOIN states s ON s.id = w.state_id
"""


def _row(record: asyncpg.Record) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        out[key] = value.isoformat() if hasattr(value, "isoformat") else value
    return out


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.isdigit():
            return int(value)
        raise HttpError(422, f"{name} must be an integer")
    return value


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list):
        raise HttpError(422, f"{name} must be a list of integers")
    return sorted({_int(v, name) for v in value})


def _check_body(req: Request) -> None:
    allowed = {p.name: p for p in req.operation.params if p.location == "body"}
    unknown = sorted(set(req.body) - set(allowed))
    if unknown:
        raise HttpError(422, f"unknown field(s) for {req.operation.operation_id}: {', '.join(unknown)}")
    for p in allowed.values():
        if p.required and p.name not in req.body:
            raise HttpError(422, f"missing required field: {p.name}")
        if p.name in req.body:
            value = req.body[p.name]
            if p.type == "string" and not isinstance(value, str):
                raise HttpError(422, f"{p.name} must be a string")
            if p.enum and value not in p.enum:
                raise HttpError(422, f"{p.name} must be one of {', '.join(p.enum)}")


async def _one(conn: Conn, query: str, *args: Any, what: str) -> asyncpg.Record:
    row = await conn.fetchrow(query, *args)
    if row is None:
        raise HttpError(404, f"{what} not found")
    return row


async def _list_projects(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch("SELECT id, identifier, name, description FROM projects ORDER BY id")
    return [_row(r) for r in rows]


async def _get_project(pool: asyncpg.Pool, req: Request) -> Any:
    async with pool.acquire() as conn:
        row = await _one(
            conn,
            "SELECT id, identifier, name, description FROM projects WHERE id = $1",
            req.path["project_id"],
            what="project",
        )
    return _row(row)


async def _list_members(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch("SELECT id, username, display_name, email, role FROM members ORDER BY id")
    return [_row(r) for r in rows]


async def _list_project_members(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch(
        "SELECT m.id, m.username, m.display_name, m.role FROM members m"
        " JOIN project_members pm ON pm.member_id = m.id WHERE pm.project_id = $1 ORDER BY m.id",
        req.path["project_id"],
    )
    return [_row(r) for r in rows]


async def _list_states(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch(
        'SELECT id, name, "group", sequence FROM states WHERE project_id = $1 ORDER BY sequence',
        req.path["project_id"],
    )
    return [_row(r) for r in rows]


async def _list_labels(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch(
        "SELECT id, project_id, name, color, description FROM labels WHERE project_id = $1 ORDER BY id",
        req.path["project_id"],
    )
    return [_row(r) for r in rows]


_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")


def _label_fields(body: dict[str, Any]) -> dict[str, Any]:
    fields = dict(body)
    if "color" in fields:
        if not _COLOR.match(fields["color"]):
            raise HttpError(422, "color must look like #8b5cf6")
        fields["color"] = fields["color"].lower()
    if "name" in fields and not fields["name"].strip():
        raise HttpError(422, "name must not be empty")
    return fields


async def _create_label(pool: asyncpg.Pool, req: Request) -> Any:
    fields = _label_fields(req.body)
    async with pool.acquire() as conn, conn.transaction():
        await _one(conn, "SELECT id FROM projects WHERE id = $1", req.path["project_id"], what="project")
        row = await _one(
            conn,
            "INSERT INTO labels (project_id, name, color, description) VALUES ($1, $2, $3, $4)"
            " RETURNING id, project_id, name, color, description",
            req.path["project_id"],
            fields["name"],
            fields.get("color", "#6b7280"),
            fields.get("description", ""),
            what="label",
        )
    return _row(row)


async def _update_label(pool: asyncpg.Pool, req: Request) -> Any:
    fields = _label_fields(req.body)
    if not fields:
        raise HttpError(422, "nothing to update")
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(fields, start=2))
    async with pool.acquire() as conn, conn.transaction():
        row = await _one(
            conn,
            f"UPDATE labels SET {sets} WHERE id = $1 RETURNING id, project_id, name, color, description",
            req.path["label_id"],
            *fields.values(),
            what="label",
        )
    return _row(row)


async def _delete_label(pool: asyncpg.Pool, req: Request) -> Any:
    async with pool.acquire() as conn, conn.transaction():
        await _one(conn, "DELETE FROM labels WHERE id = $1 RETURNING id", req.path["label_id"], what="label")
    return None


async def _list_work_items(pool: asyncpg.Pool, req: Request) -> Any:
    where = ["w.project_id = $1"]
    args: list[Any] = [req.path["project_id"]]
    q = req.query
    if "state_id" in q:
        args.append(_int(q["state_id"], "state_id"))
        where.append(f"w.state_id = ${len(args)}")
    if "priority" in q:
        args.append(q["priority"])
        where.append(f"w.priority = ${len(args)}")
    if "label_id" in q:
        args.append(_int(q["label_id"], "label_id"))
        where.append(
            "EXISTS (SELECT 1 FROM work_item_labels l"
            f" WHERE l.work_item_id = w.id AND l.label_id = ${len(args)})"
        )
    if "assignee_id" in q:
        args.append(_int(q["assignee_id"], "assignee_id"))
        where.append(
            "EXISTS (SELECT 1 FROM work_item_assignees a"
            f" WHERE a.work_item_id = w.id AND a.member_id = ${len(args)})"
        )
    if q.get("unassigned", "").lower() in ("1", "true", "yes"):
        where.append("NOT EXISTS (SELECT 1 FROM work_item_assignees a WHERE a.work_item_id = w.id)")
    rows = await pool.fetch(
        _WORK_ITEM_SELECT + " WHERE " + " AND ".join(where) + " ORDER BY w.sequence_id", *args
    )
    return [_row(r) for r in rows]


async def _fetch_work_item(conn: Conn, item_id: int) -> dict[str, Any]:
    return _row(await _one(conn, _WORK_ITEM_SELECT + " WHERE w.id = $1", item_id, what="work item"))


async def _get_work_item(pool: asyncpg.Pool, req: Request) -> Any:
    async with pool.acquire() as conn:
        return await _fetch_work_item(conn, req.path["work_item_id"])


async def _check_state(conn: Conn, project_id: int, state_id: int) -> None:
    found = await conn.fetchval(
        "SELECT 1 FROM states WHERE id = $1 AND project_id = $2", state_id, project_id
    )
    if not found:
        raise HttpError(422, f"state {state_id} does not belong to this project")


async def _set_links(conn: Conn, item_id: int, project_id: int, body: dict[str, Any]) -> None:
    """Replace the assignee and label sets named in ``body``: delete what left, insert what is new."""
    if "assignee_ids" in body:
        wanted = _int_list(body["assignee_ids"], "assignee_ids")
        known = {
            r["member_id"]
            for r in await conn.fetch(
                "SELECT member_id FROM project_members WHERE project_id = $1", project_id
            )
        }
        if set(wanted) - known:
            raise HttpError(422, f"not members of this project: {sorted(set(wanted) - known)}")
        current = {
            r["member_id"]
            for r in await conn.fetch(
                "SELECT member_id FROM work_item_assignees WHERE work_item_id = $1", item_id
            )
        }
        for member_id in sorted(current - set(wanted)):
            await conn.execute(
                "DELETE FROM work_item_assignees WHERE work_item_id = $1 AND member_id = $2",
                item_id,
                member_id,
            )
        for member_id in sorted(set(wanted) - current):
            await conn.execute(
                "INSERT INTO work_item_assignees (work_item_id, member_id) VALUES ($1, $2)",
                item_id,
                member_id,
            )
    if "label_ids" in body:
        wanted = _int_list(body["label_ids"], "label_ids")
        known = {r["id"] for r in await conn.fetch("SELECT id FROM labels WHERE project_id = $1", project_id)}
        if set(wanted) - known:
            raise HttpError(422, f"labels not in this project: {sorted(set(wanted) - known)}")
        current = {
            r["label_id"]
            for r in await conn.fetch(
                "SELECT label_id FROM work_item_labels WHERE work_item_id = $1", item_id
            )
        }
        for label_id in sorted(current - set(wanted)):
            await conn.execute(
                "DELETE FROM work_item_labels WHERE work_item_id = $1 AND label_id = $2", item_id, label_id
            )
        for label_id in sorted(set(wanted) - current):
            await conn.execute(
                "INSERT INTO work_item_labels (work_item_id, label_id) VALUES ($1, $2)", item_id, label_id
            )


_COLUMNS = ("name", "description", "priority", "state_id")


async def _create_work_item(pool: asyncpg.Pool, req: Request) -> Any:
    project_id = req.path["project_id"]
    async with pool.acquire() as conn, conn.transaction():
        await _one(conn, "SELECT id FROM projects WHERE id = $1", project_id, what="project")
        if "state_id" in req.body:
            state_id = _int(req.body["state_id"], "state_id")
            await _check_state(conn, project_id, state_id)
        else:
            state_id = await conn.fetchval(
                "SELECT id FROM states WHERE project_id = $1 ORDER BY sequence LIMIT 1", project_id
            )
        item_id = await conn.fetchval(
            "INSERT INTO work_items (project_id, sequence_id, name, description, priority, state_id)"
            " VALUES ($1, (SELECT coalesce(max(sequence_id), 0) + 1 FROM work_items WHERE project_id = $1),"
            " $2, $3, $4, $5) RETURNING id",
            project_id,
            req.body["name"],
            req.body.get("description", ""),
            req.body.get("priority", "none"),
            state_id,
        )
        await _set_links(conn, item_id, project_id, req.body)
        return await _fetch_work_item(conn, item_id)


async def _update_work_item(pool: asyncpg.Pool, req: Request) -> Any:
    item_id = req.path["work_item_id"]
    if not req.body:
        raise HttpError(422, "nothing to update")
    async with pool.acquire() as conn, conn.transaction():
        project_id = (
            await _one(conn, "SELECT project_id FROM work_items WHERE id = $1", item_id, what="work item")
        )["project_id"]
        fields = {k: req.body[k] for k in _COLUMNS if k in req.body}
        if "state_id" in fields:
            fields["state_id"] = _int(fields["state_id"], "state_id")
            await _check_state(conn, project_id, fields["state_id"])
        if fields:
            sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(fields, start=2))
            await conn.execute(
                f"UPDATE work_items SET {sets}, updated_at = now() WHERE id = $1", item_id, *fields.values()
            )
        await _set_links(conn, item_id, project_id, req.body)
        return await _fetch_work_item(conn, item_id)


async def _delete_work_item(pool: asyncpg.Pool, req: Request) -> Any:
    async with pool.acquire() as conn, conn.transaction():
        await _one(
            conn,
            "DELETE FROM work_items WHERE id = $1 RETURNING id",
            req.path["work_item_id"],
            what="work item",
        )
    return None


async def _list_assignees(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch(
        "SELECT m.id, m.username, m.display_name FROM work_item_assignees a"
        " JOIN members m ON m.id = a.member_id WHERE a.work_item_id = $1 ORDER BY m.id",
        req.path["work_item_id"],
    )
    return [_row(r) for r in rows]


async def _add_assignee(pool: asyncpg.Pool, req: Request) -> Any:
    item_id = req.path["work_item_id"]
    member_id = _int(req.body["member_id"], "member_id")
    async with pool.acquire() as conn, conn.transaction():
        item = await _fetch_work_item(conn, item_id)
        if member_id in item["assignee_ids"]:
            raise HttpError(409, "member is already assigned to this work item")
        await _set_links(
            conn, item_id, item["project_id"], {"assignee_ids": [*item["assignee_ids"], member_id]}
        )
        return await _fetch_work_item(conn, item_id)


async def _remove_assignee(pool: asyncpg.Pool, req: Request) -> Any:
    async with pool.acquire() as conn, conn.transaction():
        await _one(
            conn,
            "DELETE FROM work_item_assignees WHERE work_item_id = $1 AND member_id = $2 RETURNING member_id",
            req.path["work_item_id"],
            req.path["member_id"],
            what="assignee",
        )
    return None


async def _list_item_labels(pool: asyncpg.Pool, req: Request) -> Any:
    rows = await pool.fetch(
        "SELECT l.id, l.name, l.color FROM work_item_labels wl JOIN labels l ON l.id = wl.label_id"
        " WHERE wl.work_item_id = $1 ORDER BY l.id",
        req.path["work_item_id"],
    )
    return [_row(r) for r in rows]


async def _add_item_label(pool: asyncpg.Pool, req: Request) -> Any:
    item_id = req.path["work_item_id"]
    label_id = _int(req.body["label_id"], "label_id")
    async with pool.acquire() as conn, conn.transaction():
        item = await _fetch_work_item(conn, item_id)
        if label_id in item["label_ids"]:
            raise HttpError(409, "the work item already has this label")
        await _set_links(conn, item_id, item["project_id"], {"label_ids": [*item["label_ids"], label_id]})
        return await _fetch_work_item(conn, item_id)


async def _remove_item_label(pool: asyncpg.Pool, req: Request) -> Any:
    async with pool.acquire() as conn, conn.transaction():
        await _one(
            conn,
            "DELETE FROM work_item_labels WHERE work_item_id = $1 AND label_id = $2 RETURNING label_id",
            req.path["work_item_id"],
            req.path["label_id"],
            what="label link",
        )
    return None


HANDLERS: dict[str, Handler] = {
    "listProjects": _list_projects,
    "getProject": _get_project,
    "listMembers": _list_members,
    "listProjectMembers": _list_project_members,
    "listStates": _list_states,
    "listLabels": _list_labels,
    "createLabel": _create_label,
    "updateLabel": _update_label,
    "deleteLabel": _delete_label,
    "listWorkItems": _list_work_items,
    "getWorkItem": _get_work_item,
    "createWorkItem": _create_work_item,
    "updateWorkItem": _update_work_item,
    "deleteWorkItem": _delete_work_item,
    "listWorkItemAssignees": _list_assignees,
    "addWorkItemAssignee": _add_assignee,
    "removeWorkItemAssignee": _remove_assignee,
    "listWorkItemLabels": _list_item_labels,
    "addWorkItemLabel": _add_item_label,
    "removeWorkItemLabel": _remove_item_label,
}
assert set(HANDLERS) == set(BY_ID)


async def dispatch(pool: asyncpg.Pool, method: str, target: str, raw_body: bytes) -> tuple[int, Any]:
    """Route one request; returns (status, JSON-able payload)."""
    parts = urlsplit(target)
    if method == "GET" and parts.path in ("/openapi.json", "/api/openapi.json"):
        return 200, openapi.document()
    if method == "GET" and parts.path == "/healthz":
        await pool.fetchval("SELECT 1")
        return 200, {"status": "ok"}
    allowed = False
    for route_method, pattern, op in _ROUTES:
        match = pattern.match(parts.path)
        if not match:
            continue
        allowed = True
        if route_method != method:
            continue
        try:
            path = {k: int(v) for k, v in match.groupdict().items()}
        except ValueError:
            raise HttpError(404, "ids in the path are integers") from None
        try:
            body = json.loads(raw_body) if raw_body.strip() else {}
        except ValueError:
            raise HttpError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the request body must be a JSON object")
        req = Request(op, path, dict(parse_qsl(parts.query)), body)
        _check_body(req)
        try:
            return op.status, await HANDLERS[op.operation_id](pool, req)
        except asyncpg.UniqueViolationError as exc:
            raise HttpError(409, f"already exists: {exc.detail or exc}") from None
        except asyncpg.ForeignKeyViolationError as exc:
            raise HttpError(422, f"unknown reference: {exc.detail or exc}") from None
        except (
            asyncpg.CheckViolationError,
            asyncpg.NotNullViolationError,
            asyncpg.InvalidTextRepresentationError,
            asyncpg.DataError,
        ) as exc:
            raise HttpError(422, str(exc)) from None
    raise HttpError(405 if allowed else 404, "method not allowed" if allowed else "no such route")


async def _handle(pool: asyncpg.Pool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                got = await read_request(reader, MAX_BODY)
            except http.HttpError as exc:
                if exc.status == 413:
                    writer.write(http.response(413, json.dumps({"error": "request body too large"}).encode()))
                    await writer.drain()
                return
            if got is None:
                return
            request, body = got
            try:
                status, payload = await dispatch(pool, request.method, request.target, body)
            except HttpError as exc:
                status, payload = exc.status, {"error": exc.message}
            except asyncpg.PostgresError as exc:
                status, payload = 500, {"error": f"database error {exc.sqlstate}: {exc}"}
            except (OSError, asyncpg.InterfaceError) as exc:
                status, payload = 503, {"error": f"database unavailable: {exc}"}
            data = b"" if status == 204 else json.dumps(payload).encode()
            writer.write(http.response(status, data, keep_alive=request.keep_alive))
            await writer.drain()
            if not request.keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@dataclass(frozen=True)
class AppConfig:
    database_url: str
    host: str = "127.0.0.1"
    port: int = 0
    pool_size: int = 4


async def serve(
    config: AppConfig, ready: Callable[[int], None] | None = None, stop: asyncio.Event | None = None
) -> None:
    """Serve until ``stop`` is set (or forever); ``ready`` gets the bound port."""
    # min_size 0: no background reconnects (and their log noise) when the server goes away at shutdown.
    pool = await asyncpg.create_pool(config.database_url, min_size=0, max_size=config.pool_size)
    try:
        server = await asyncio.start_server(lambda r, w: _handle(pool, r, w), config.host, config.port)
        async with server:
            port = int(server.sockets[0].getsockname()[1])
            if ready is not None:
                ready(port)
            await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await pool.close()


class BackgroundApp:
    """The application on its own event loop in a daemon thread (used by the demo and the tests)."""

    def __init__(self, config: AppConfig) -> None:
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._port = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="demo-app", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()

            def ready(port: int) -> None:
                self._port = port
                self._ready.set()

            await serve(self._config, ready, self._stop)

        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise DemoError(f"the sample application did not start within {timeout:.0f} s")
        if self._error is not None:
            detail = " ".join(str(self._error).split()) or type(self._error).__name__
            raise DemoError(f"the sample application could not start: {detail}")
        return f"http://{self._config.host}:{self._port}"

    def stop(self, timeout: float = 15.0) -> None:
        if self._thread.is_alive() and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)


async def setup_database(dsn: str) -> seed.SeedCounts:
    """Create the application's tables and load the seed data (a fresh database)."""
    conn = await asyncpg.connect(dsn)
    try:
        if await conn.fetchval("SELECT to_regclass('public.work_items') IS NOT NULL"):
            raise HttpError(409, "the sample application's tables already exist in this database")
        schema = resources.files("demo").joinpath("schema.sql").read_text()
        await conn.execute(schema)
        return await seed.load(conn)
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.app", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="serve the REST API")
    serve_p.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    setup_p = sub.add_parser(
        "setup", help="create the tables and load the seed data if missing, then install the CoW layer"
    )
    setup_p.add_argument("--no-layer", action="store_true", help="do not install the CoW layer")
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("demo.app: error: set DATABASE_URL", file=sys.stderr)
        return 1
    if args.command == "setup":
        try:
            asyncio.run(_setup(url, layer=not args.no_layer))
        except (OSError, asyncpg.PostgresError, DemoError) as exc:
            print(f"demo.app: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        return 0
    host, _, port = args.listen.rpartition(":")
    config = AppConfig(url, host or "0.0.0.0", int(port))
    print(f"serving on http://{config.host}:{config.port} (OpenAPI at /openapi.json)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))
    return 0


async def _setup(url: str, *, layer: bool) -> None:
    """Idempotent: seeds a database without the tables, skips one that has them; installs the layer."""
    try:
        counts = await setup_database(url)
        print(f"created the tables and loaded the seed data: {counts}", flush=True)
    except HttpError:
        print("the tables exist already: not seeding again", flush=True)
    if layer:
        conn = await asyncpg.connect(url)
        try:
            await migrations.install_layer(conn, schemas=("public",))
        finally:
            await conn.close()
        print("installed the CoW layer on schema public", flush=True)


if __name__ == "__main__":
    sys.exit(main())
