"""The model adapter against replies in the shapes real OpenAI-compatible servers send.

The bodies below follow what vLLM (hermes tool parser), llama.cpp's ``llama-server --jinja`` and Ollama's
``/v1/chat/completions`` return for tool calls — their envelopes, ids, ``content`` of ``null`` or ``""``,
extra fields (``timings``, ``stop_reason``, ``system_fingerprint``), parallel tool calls in one message — and
Ollama's native form of arguments (an object, not a JSON string). Malformed replies (a body that is not
JSON, no choices, arguments that do not parse, a call without a function) are failed steps of the agent:
it is told, the step counts against its operation limit, and the demo goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from demo import agents, workflows
from demo.api import HttpApi
from tests.fix_demo import FakeModel

pytestmark = pytest.mark.timeout(120)


def _call(
    server: str, n: int, name: str, arguments: dict[str, Any], *, as_object: bool = False
) -> dict[str, Any]:
    ids = {
        "vllm": f"chatcmpl-tool-{n:032x}",
        "llama.cpp": f"N3pEuRVKuvqF9kZr0aXwXoVq{n:08d}",
        "ollama": f"call_{n:08x}",
    }
    out: dict[str, Any] = {
        "id": ids[server],
        "type": "function",
        "function": {"name": name, "arguments": arguments if as_object else json.dumps(arguments)},
    }
    if server == "ollama":
        out["index"] = n
    return out


def _body(server: str, model: str, message: dict[str, Any], finish: str) -> dict[str, Any]:
    """A chat.completion body in the envelope of ``server``."""
    usage = {"prompt_tokens": 812, "completion_tokens": 41, "total_tokens": 853}
    if server == "vllm":
        return {
            "id": "chatcmpl-8d1f",
            "object": "chat.completion",
            "created": 1764622000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {**message, "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
            "usage": usage,
            "prompt_logprobs": None,
        }
    if server == "llama.cpp":
        return {
            "choices": [{"finish_reason": finish, "index": 0, "message": message}],
            "created": 1764622000,
            "model": "gpt-3.5-turbo",
            "system_fingerprint": "b6100-3f4e2a1",
            "object": "chat.completion",
            "usage": usage,
            "id": "chatcmpl-X2bq",
            "timings": {"prompt_n": 812, "prompt_ms": 402.1, "predicted_n": 41, "predicted_ms": 980.5},
        }
    return {
        "id": "chatcmpl-417",
        "object": "chat.completion",
        "created": 1764622000,
        "model": model,
        "system_fingerprint": "fp_ollama",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def _conversation(server: str, project_id: int, *, as_object: bool = False) -> list[dict[str, Any]]:
    """Two parallel discovers, then listProjects, then createLabel, then a final answer."""
    content: str | None = "" if server == "ollama" else None
    return [
        _body(
            server,
            "qwen2.5",
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    _call(server, 0, "discover", {"query": "create label"}, as_object=as_object),
                    _call(server, 1, "discover", {"query": "list projects"}, as_object=as_object),
                ],
            },
            "tool_calls",
        ),
        _body(
            server,
            "qwen2.5",
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    _call(
                        server,
                        2,
                        "execute",
                        {"operation_id": "listProjects", "arguments": {}},
                        as_object=as_object,
                    ),
                ],
            },
            "tool_calls",
        ),
        _body(
            server,
            "qwen2.5",
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    _call(
                        server,
                        3,
                        "execute",
                        {
                            "operation_id": "createLabel",
                            "arguments": {
                                "project_id": project_id,
                                "name": f"from-{server}",
                                "color": "#123456",
                            },
                        },
                        as_object=as_object,
                    ),
                ],
            },
            "tool_calls",
        ),
        _body(server, "qwen2.5", {"role": "assistant", "content": "Created the label."}, "stop"),
    ]


def _run(model: FakeModel, app_api: HttpApi) -> tuple[agents.AgentResult, agents.Tools]:
    agent = agents.OpenAIChatAgent(agents.ModelConfig("qwen2.5", model.url, None))
    tools = agents.Tools(app_api)
    return agent.run(workflows.BY_SLUG["campaign-push"], tools), tools


def _labels(app_api: HttpApi, project_id: int) -> list[str]:
    return [lab["name"] for lab in app_api.call("listLabels", {"project_id": project_id})]


@pytest.mark.parametrize(
    ("server", "as_object"), [("vllm", False), ("llama.cpp", False), ("ollama", False), ("ollama", True)]
)
def test_parallel_tool_calls_in_each_servers_format(
    app_api: HttpApi, fake_model: Callable[..., FakeModel], server: str, as_object: bool
) -> None:
    gs = app_api.call("listProjects", {})[2]["id"]
    model = fake_model(_conversation(server, gs, as_object=as_object), raw=True)
    result, tools = _run(model, app_api)
    assert result == agents.AgentResult(True, "Created the label.")
    assert [(c.tool, c.argument, c.ok) for c in tools.calls] == [
        ("discover", "create label", True),
        ("discover", "list projects", True),
        ("execute", "listProjects", True),
        ("execute", "createLabel", True),
    ]
    assert f"from-{server}" in _labels(app_api, gs)
    # Each tool result answered its own call id, in order; the calls went back with string arguments.
    second = model.requests[1]["messages"]
    assistant, *results = second[2:]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in assistant["tool_calls"]]
    assert all(isinstance(c["function"]["arguments"], str) for c in assistant["tool_calls"])
    assert len(results) == 2 and all(json.loads(m["content"]) for m in results)


def test_malformed_replies_are_failed_steps(app_api: HttpApi, fake_model: Callable[..., FakeModel]) -> None:
    gs = app_api.call("listProjects", {})[2]["id"]
    ok = _conversation("vllm", gs)
    bad_args = _body(
        "vllm",
        "m",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "discover", "arguments": '{"query": "label"'},
                },
                {"id": "b", "type": "function", "function": {"name": "execute", "arguments": "[1, 2]"}},
                {"id": "c", "type": "function"},
                {"id": "d", "type": "function", "function": {"name": "drop_database", "arguments": "{}"}},
                {
                    "id": "e",
                    "type": "function",
                    "function": {
                        "name": "execute",
                        "arguments": '{"operation_id": "createLabel", "arguments": 7}',
                    },
                },
            ],
        },
        "tool_calls",
    )
    replies: list[Any] = [
        "<html>502 Bad Gateway</html>",  # not JSON
        {"object": "error", "message": "overloaded"},  # no choices
        {"choices": [{"index": 0, "finish_reason": "length"}]},  # a choice without a message
        {"choices": []},
        bad_args,
        *ok,
    ]
    model = fake_model(replies, raw=True)
    result, tools = _run(model, app_api)
    assert result.completed and result.message == "Created the label."
    failed = [c.argument for c in tools.calls if c.tool == "model"]
    assert failed == [
        "malformed reply: the reply is not JSON",
        "malformed reply: the reply has no choices",
        "malformed reply: the reply's first choice has no message",
        "malformed reply: the reply has no choices",
    ]
    # The five broken calls of one message each got an error as their tool result; none reached the app.
    answers = [m for m in model.requests[5]["messages"] if m["role"] == "tool"]
    assert [json.loads(m["content"])["error"] for m in answers] == [
        "arguments are not valid JSON",
        "arguments must be a JSON object",
        "the tool call has no function name",
        "unknown tool 'drop_database'",
        "arguments must be an object",
    ]
    assert "from-vllm" in _labels(app_api, gs)
    # The model was told about each malformed reply.
    told = [m["content"] for m in model.requests[4]["messages"] if m["role"] == "user"][1:]
    assert told[0] == "Your last reply could not be used: the reply is not JSON."


def test_endless_malformed_replies_end_at_the_operation_limit(
    app_api: HttpApi, fake_model: Callable[..., FakeModel]
) -> None:
    model = fake_model(["not json"], raw=True)
    agent = agents.OpenAIChatAgent(agents.ModelConfig("m", model.url, None))
    tools = agents.Tools(app_api, limit=5)
    result = agent.run(workflows.BY_SLUG["campaign-push"], tools)
    assert result == agents.AgentResult(False, "operation limit of 5 reached")
    assert len(model.requests) == 6 and len(tools.calls) == 5
