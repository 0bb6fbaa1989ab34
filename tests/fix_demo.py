"""Fixtures of the demo's tests: a seeded sample database, the application on it, a fake model endpoint."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from demo.api import HttpApi
from demo.app import AppConfig, BackgroundApp, setup_database


@pytest.fixture
def seeded_db(create_database: Callable[..., str]) -> str:
    """A fresh database with the sample application's tables and seed data (no CoW layer)."""
    dsn = create_database()
    asyncio.run(setup_database(dsn))
    return dsn


@pytest.fixture
def app_api(seeded_db: str) -> Iterator[HttpApi]:
    app = BackgroundApp(AppConfig(seeded_db))
    url = app.start()
    try:
        yield HttpApi(url)
    finally:
        app.stop()


@dataclass
class FakeModel:
    """A tiny OpenAI-compatible endpoint answering with scripted assistant messages, in order; the last one
    repeats. It records every request body and Authorization header it received."""

    replies: list[dict[str, Any]] | Callable[[dict[str, Any]], dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    status: int = 200
    url: str = ""
    raw: bool = False  # replies are whole response bodies (a dict, or a str sent as is), not messages


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


@pytest.fixture
def fake_model() -> Iterator[Callable[..., FakeModel]]:
    servers: list[ThreadingHTTPServer] = []

    def start(
        replies: list[dict[str, Any]] | Callable[[dict[str, Any]], dict[str, Any]],
        status: int = 200,
        raw: bool = False,
    ) -> FakeModel:
        model = FakeModel(replies=replies, status=status, raw=raw)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                model.requests.append(body)
                model.auth.append(self.headers.get("Authorization"))
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                if model.status != 200:
                    payload = json.dumps({"error": {"message": "scripted failure"}}).encode()
                    self.send_response(model.status)
                else:
                    if callable(model.replies):
                        message = model.replies(body)
                    else:
                        message = model.replies[min(len(model.requests), len(model.replies)) - 1]
                    if model.raw:
                        payload = (message if isinstance(message, str) else json.dumps(message)).encode()
                    else:
                        payload = json.dumps(
                            {"id": "x", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
                        ).encode()  # fmt: skip
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        model.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        return model

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
