"""The agents' tools and the OpenAI-compatible adapter (against a local fake endpoint, never the internet)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from demo import agents, workflows
from demo.api import HttpApi
from demo.errors import DemoError
from tests.fix_demo import FakeModel, tool_call


def test_discover_finds_work_item_operations_but_nothing_for_issue(app_api: HttpApi) -> None:
    tools = agents.Tools(app_api)
    assert tools.discover("issue") == []
    assert tools.discover("issues") == []
    found = [r["operation_id"] for r in tools.discover("add label to work item")]
    assert found[0] == "addWorkItemLabel"
    assert "updateWorkItem" in [r["operation_id"] for r in tools.discover("update work item")]
    assert [c.tool for c in tools.calls] == ["discover"] * 4


def test_operation_limit_stops_an_agent(app_api: HttpApi) -> None:
    tools = agents.Tools(app_api, limit=3)
    tools.discover("label")
    tools.execute("listProjects", {})
    tools.discover("state")
    with pytest.raises(agents.BudgetExhausted):
        tools.execute("listMembers", {})
    assert len(tools.calls) == 3


def test_vocabulary_agent_gives_up_and_creates_only_the_label(app_api: HttpApi) -> None:
    tools = agents.Tools(app_api)
    result = agents.VocabularyAgent().run(workflows.BY_SLUG["campaign-push"], tools)
    assert not result.completed
    assert tools.writes == 1
    gs = app_api.call("listProjects", {})[2]
    names = [lab["name"] for lab in app_api.call("listLabels", {"project_id": gs["id"]})]
    assert names[-1] == "campaign-active-v2"
    result = agents.VocabularyAgent().run(workflows.BY_SLUG["sprint-kickoff"], agents.Tools(app_api))
    assert not result.completed


def test_scripted_agents_use_only_operations_they_discovered(app_api: HttpApi) -> None:
    tools = agents.Tools(app_api)
    agents.CorrectAgent().run(workflows.BY_SLUG["bug-escalation"], tools)
    discovered: set[str] = set()
    for call in tools.calls:
        if call.tool == "discover":
            discovered |= {r["operation_id"] for r in agents.Tools(app_api).discover(call.argument)}
        else:
            assert call.argument in discovered
    assert tools.writes == 4


def test_model_agent_runs_tool_calls_from_the_endpoint(
    app_api: HttpApi, fake_model: Callable[..., FakeModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    gs_id = app_api.call("listProjects", {})[2]["id"]
    model = fake_model(
        [
            tool_call("c1", "discover", {"query": "create label"}),
            tool_call("c2", "execute", {"operation_id": "createLabel",
                                        "arguments": {"project_id": gs_id, "name": "from-model",
                                                      "color": "#123456"}}),
            tool_call("c3", "execute", {"operation_id": "getWorkItem", "arguments": {"id": 1}}),
            {"role": "assistant", "content": "Created the label."},
        ]
    )  # fmt: skip
    agent = agents.OpenAIChatAgent(agents.ModelConfig("fake-model", model.url, "sk-test"))
    tools = agents.Tools(app_api)
    result = agent.run(workflows.BY_SLUG["campaign-push"], tools)
    assert result == agents.AgentResult(True, "Created the label.")
    assert [c.tool for c in tools.calls] == ["discover", "execute", "execute"]
    assert tools.writes == 1
    labels = app_api.call("listLabels", {"project_id": gs_id})
    assert any(lab["name"] == "from-model" and lab["color"] == "#123456" for lab in labels)
    # What the endpoint saw: the model name, both tools, the prompt, then each tool result in turn.
    first = model.requests[0]
    assert first["model"] == "fake-model"
    assert {t["function"]["name"] for t in first["tools"]} == {"discover", "execute"}
    assert first["messages"][1] == {"role": "user", "content": workflows.BY_SLUG["campaign-push"].prompt}
    assert model.auth == ["Bearer sk-test"] * 4
    tool_messages = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2", "c3"]
    assert "createLabel" in tool_messages[0]["content"]
    assert "from-model" in tool_messages[1]["content"]
    assert "unknown argument" in tool_messages[2]["content"]  # the paper's `id` for `work_item_id`


def test_model_agent_stops_at_the_operation_limit(
    app_api: HttpApi, fake_model: Callable[..., FakeModel]
) -> None:
    model = fake_model([tool_call("c", "discover", {"query": "issue"})])  # searches forever
    agent = agents.OpenAIChatAgent(agents.ModelConfig("m", model.url, None))
    tools = agents.Tools(app_api, limit=5)
    result = agent.run(workflows.BY_SLUG["sprint-kickoff"], tools)
    assert not result.completed and "limit" in result.message
    assert len(tools.calls) == 5
    assert model.auth[0] is None


def test_model_endpoint_errors_are_one_line(app_api: HttpApi, fake_model: Callable[..., FakeModel]) -> None:
    model = fake_model([], status=500)
    agent = agents.OpenAIChatAgent(agents.ModelConfig("m", model.url, None))
    with pytest.raises(DemoError, match="HTTP 500") as info:
        agent.run(workflows.BY_SLUG["sprint-kickoff"], agents.Tools(app_api))
    assert "\n" not in str(info.value)
    unreachable = agents.OpenAIChatAgent(agents.ModelConfig("m", "http://127.0.0.1:9/v1", None, timeout=5))
    with pytest.raises(DemoError, match="failed"):
        unreachable.run(workflows.BY_SLUG["sprint-kickoff"], agents.Tools(app_api))
