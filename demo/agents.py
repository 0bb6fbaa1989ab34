"""The agent side of the demo: the paper's two tools and the agents that use them.

Tools: ``discover`` searches the application's OpenAPI operations by keywords, ``execute`` calls one.
Every tool call counts towards a limit of 50 operations per session, as in the paper.

Scripted agents reproduce the failure modes the paper found; they are given the workflow's rule (they
are scripts, not models), and differ only in what they do with it:
- ``correct``: the ideal writes;
- ``vocabulary``: searches for "issue" — the application says "work item" — finds nothing useful and
  gives up after the part that needs no work-item operation (creating the new label, if any);
- ``overreach``: the ideal writes plus extra rows: a "triaged" label attached to every work item it touched;
- ``wrong-state``: the right rows with wrong values: it confuses workflow states and picks the one after
  the intended state (Todo→In Progress, In Progress→Done, Backlog→Todo, Cancelled→Done).
``OpenAIChatAgent`` drives a real model through an OpenAI-compatible chat-completions endpoint.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from demo import workflows
from demo.api import ApiError, HttpApi
from demo.errors import DemoError
from demo.openapi import BY_ID, OPERATIONS, Operation
from demo.workflows import Plan, Snapshot, Workflow

OPERATION_LIMIT = 50
_STOP = frozenset(
    ("a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "by", "with", "is", "it", "all")
)


class BudgetExhausted(DemoError):
    """The agent used up its operations."""


class MalformedReply(DemoError):
    """A model endpoint's reply that is not a chat completion (a failed step of the agent)."""


def _words(text: str) -> list[str]:
    # camelCase and kebab-case split into words; a crude plural strip so "labels" finds "label".
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower()
    out = []
    for w in re.findall(r"[a-z]+", text):
        if w in _STOP:
            continue
        out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def _op_text(op: Operation) -> str:
    return " ".join(
        [op.operation_id, op.summary, op.description, op.tag, op.path, *(p.name for p in op.params)]
    )


# The paper's fix of the tool surface: the prompts say "issue", the application "work item". With the fix,
# discover reads "issue" as "work item" and the operations on work items say that they are issues too.
SYNONYMS = {"issue": ("work", "item")}
ALSO_KNOWN_AS = "also called issues (an issue is a work item)"


def _fixed_words(words: list[str]) -> list[str]:
    out: list[str] = []
    for w in words:
        out.extend(SYNONYMS.get(w, (w,)))
    return out


def describe(op: Operation, fixed: bool = False) -> dict[str, Any]:
    if fixed and op.tag == "work items":
        return {**describe(op), "description": f"{op.description} Work items are {ALSO_KNOWN_AS}."}
    return {
        "operation_id": op.operation_id,
        "method": op.method,
        "path": op.path,
        "summary": op.summary,
        "description": op.description,
        "arguments": {
            p.name: {"in": p.location, "type": p.type, "required": p.required, "description": p.description}
            | ({"enum": list(p.enum)} if p.enum else {})
            for p in op.params
        },
    }


@dataclass(frozen=True)
class ToolCall:
    tool: str  # "discover" | "execute"
    argument: str  # the query, or the operation id
    ok: bool


@dataclass
class Tools:
    """The two tools of the paper's harness, over one application, with the operation limit."""

    api: HttpApi
    limit: int = OPERATION_LIMIT
    calls: list[ToolCall] = field(default_factory=list)
    checkpoint: Callable[[], None] | None = None  # the harness's Ctrl-C check, before every call
    fixed_vocabulary: bool = False  # the fixed tool surface: "issue" also finds work-item operations

    def _spend(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint()
        if len(self.calls) >= self.limit:
            raise BudgetExhausted(f"operation limit of {self.limit} reached")

    def discover(self, query: str, top: int = 5) -> list[dict[str, Any]]:
        """Operations ranked by how many query words they share with their name, summary and description."""
        self._spend()
        words = _words(query)
        wanted = Counter(_fixed_words(words) if self.fixed_vocabulary else words)
        ranked: list[tuple[float, int, Operation]] = []
        for position, op in enumerate(OPERATIONS):
            have = set(_words(_op_text(op)))
            score = sum(n for w, n in wanted.items() if w in have)
            if score:
                ranked.append((-score, position, op))
        ranked.sort(key=lambda t: (t[0], t[1]))
        found = [describe(op, self.fixed_vocabulary) for _, _, op in ranked[:top]]
        self.calls.append(ToolCall("discover", query, bool(found)))
        return found

    def execute(self, operation_id: str, arguments: dict[str, Any]) -> Any:
        self._spend()
        try:
            result = self.api.call(operation_id, arguments)
        except ApiError:
            self.calls.append(ToolCall("execute", operation_id, False))
            raise
        self.calls.append(ToolCall("execute", operation_id, True))
        return result

    def failed_step(self, what: str) -> None:
        """A step of the agent that did not reach the application (e.g. a malformed model reply): it
        counts against the operation limit like any tool call."""
        self._spend()
        self.calls.append(ToolCall("model", what, False))

    @property
    def writes(self) -> int:

        return sum(1 for c in self.calls if c.tool == "execute" and c.ok and BY_ID[c.argument].writes)


@dataclass(frozen=True)
class AgentResult:
    completed: bool
    message: str


class Agent(Protocol):
    name: str
    model: str

    def run(self, workflow: Workflow, tools: Tools) -> AgentResult: ...


class _ToolCaller:
    """Lets a scripted agent run the workflow code through ``execute``, after finding operations with
    ``discover`` (it uses the operation ids that discover returned, never hard-coded ones)."""

    QUERIES: ClassVar[dict[str, str]] = {
        "listProjects": "list projects",
        "listStates": "list workflow states of a project",
        "listLabels": "list labels of a project",
        "listMembers": "list workspace members",
        "listWorkItems": "list work items of a project",
        "updateWorkItem": "update work item state priority assignees labels",
        "createLabel": "create label",
        "addWorkItemLabel": "add label to work item",
    }

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.found: dict[str, str] = {}

    def resolve(self, need: str) -> str:
        if need not in self.found:
            results = self.tools.discover(self.QUERIES[need])
            ids = [r["operation_id"] for r in results]
            if need not in ids:
                raise DemoError(f"discover did not find an operation for {self.QUERIES[need]!r}")
            self.found[need] = need
        return self.found[need]

    def call(self, operation_id: str, arguments: dict[str, Any]) -> Any:
        return self.tools.execute(self.resolve(operation_id), arguments)


class ScriptedAgent:
    """Base of the scripted agents: read the project, plan with the rule, let ``adjust`` alter it."""

    name = "scripted"
    model = "scripted"

    def adjust(self, snap: Snapshot, plan: Plan) -> Plan:
        return plan

    def after(self, caller: _ToolCaller, snap: Snapshot, plan: Plan) -> None:
        del caller, snap, plan

    def run(self, workflow: Workflow, tools: Tools) -> AgentResult:
        caller = _ToolCaller(tools)
        snap, plan = workflows.plan_for(caller, workflow)
        plan = self.adjust(snap, plan)
        workflows.execute_plan(caller, snap, plan)
        self.after(caller, snap, plan)
        return AgentResult(True, f"{len(plan.changes)} work item(s) changed")


class CorrectAgent(ScriptedAgent):
    name = "correct"
    model = "scripted:correct"


class WrongStateAgent(ScriptedAgent):
    name = "wrong-state"
    model = "scripted:wrong-state"
    SHIFT: ClassVar[dict[str, str]] = {
        "Backlog": "Todo",
        "Todo": "In Progress",
        "In Progress": "Done",
        "Cancelled": "Done",
    }

    def adjust(self, snap: Snapshot, plan: Plan) -> Plan:
        return workflows.with_state_shift(snap, plan, self.SHIFT)


class OverreachAgent(ScriptedAgent):
    name = "overreach"
    model = "scripted:overreach"
    EXTRA_LABEL = ("triaged", "#0d9488")

    def after(self, caller: _ToolCaller, snap: Snapshot, plan: Plan) -> None:
        name, color = self.EXTRA_LABEL
        label = caller.call("createLabel", {"project_id": snap.project["id"], "name": name, "color": color})
        for change in plan.changes:
            caller.call("addWorkItemLabel", {"work_item_id": change.item_id, "label_id": label["id"]})


class VocabularyAgent:
    """Takes the prompt's word "issue" literally; the API only knows work items."""

    name = "vocabulary"
    model = "scripted:vocabulary"
    QUERIES = ("issues", "list issues", "update issue state", "issue tracker")

    def run(self, workflow: Workflow, tools: Tools) -> AgentResult:
        # It keeps only results that talk about issues. The API calls them work items, so none qualify —
        # unless the tool surface is fixed, and then it does the work like a good agent.
        relevant = []
        for query in self.QUERIES:
            relevant += [r for r in tools.discover(query) if "issue" in json.dumps(r).lower()]
        if relevant:
            return CorrectAgent().run(workflow, tools)
        label = _label_only(workflow)
        if label is None:
            return AgentResult(False, "gave up: no operation for issues")
        caller = _ToolCaller(tools)
        projects = caller.call("listProjects", {})
        project = next(p for p in projects if p["identifier"] == workflow.project)
        caller.call("createLabel", {"project_id": project["id"], "name": label[0], "color": label[1]})
        return AgentResult(False, "created the label, found no operation for issues, gave up")


def _label_only(workflow: Workflow) -> tuple[str, str] | None:
    """The label a workflow creates, read from its prompt (the only part that needs no issue operation)."""
    match = re.search(r"create the label (\S+) with color (#[0-9a-f]{6})", workflow.prompt)
    return (match.group(1), match.group(2)) if match else None


SCRIPTED: tuple[type[ScriptedAgent] | type[VocabularyAgent], ...] = (
    CorrectAgent,
    VocabularyAgent,
    OverreachAgent,
    WrongStateAgent,
)


# --- a real model behind an OpenAI-compatible endpoint ---------------------------------------------------

SYSTEM_PROMPT = (
    "You operate a project-management application through its REST API. You have two tools: discover"
    " (search the API's operations by keywords) and execute (call one operation with its arguments as a"
    " flat JSON object of path, query and body fields). You have at most {limit} tool calls. Do exactly"
    " what the user asks, nothing more; when you are done, answer with a short summary and no tool call."
)

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "discover",
            "description": "Search the application's API operations by keywords; returns matching operations"
            " with their ids, paths and arguments.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "keywords"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "execute",
            "description": "Call one API operation by its operation_id with a flat object of arguments.",
            "parameters": {
                "type": "object",
                "properties": {
                    "operation_id": {"type": "string"},
                    "arguments": {"type": "object", "description": "path, query and body fields"},
                },
                "required": ["operation_id"],
            },
        },
    },
]


@dataclass(frozen=True)
class ModelConfig:
    model: str
    base_url: str
    api_key: str | None
    timeout: float = 120.0
    temperature: float = 0.0


class OpenAIChatAgent:
    """Chat completions with tool calls (stdlib urllib, no SDK)."""

    name = "model"

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.model = config.model
        self.name = f"model:{config.model}"

    def _complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        payload = {
            "model": self.config.model,
            "messages": messages,
            "tools": TOOL_SCHEMAS,
            "tool_choice": "auto",
            "temperature": self.config.temperature,
        }
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        request = urllib.request.Request(
            self.config.base_url.rstrip("/") + "/chat/completions",
            data=json.dumps(payload).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                detail = " ".join(exc.read().decode(errors="replace").split())[:300]
            raise DemoError(f"the model endpoint answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise DemoError(f"the model endpoint {self.config.base_url} failed: {exc}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            raise MalformedReply("the reply is not JSON") from None
        if not isinstance(body, dict):
            raise MalformedReply("the reply is not a JSON object")
        return body

    def _tool(self, tools: Tools, name: str, raw_arguments: Any) -> Any:
        if isinstance(raw_arguments, dict):  # Ollama's native API sends an object, not a JSON string
            args: Any = raw_arguments
        else:
            try:
                args = json.loads(raw_arguments or "{}") if isinstance(raw_arguments, str) else raw_arguments
            except ValueError:
                return {"error": "arguments are not valid JSON"}
        if not isinstance(args, dict):
            return {"error": "arguments must be a JSON object"}
        try:
            if name == "discover":
                return tools.discover(str(args.get("query", "")))
            if name == "execute":
                arguments = args.get("arguments") or {}
                if not isinstance(arguments, dict):
                    return {"error": "arguments must be an object"}
                result = tools.execute(str(args.get("operation_id", "")), arguments)
                return {"ok": True} if result is None else result
        except ApiError as exc:
            return {"error": str(exc)}
        return {"error": f"unknown tool {name!r}"}

    def run(self, workflow: Workflow, tools: Tools) -> AgentResult:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT.format(limit=tools.limit)},
            {"role": "user", "content": workflow.prompt},
        ]
        try:
            while True:
                try:
                    reply = _message(self._complete(messages))
                except MalformedReply as exc:
                    # A failed step: it costs an operation, and the model is told and asked again.
                    tools.failed_step(f"malformed reply: {exc}")
                    messages.append({"role": "user", "content": f"Your last reply could not be used: {exc}."})
                    continue
                calls = _tool_calls(reply)
                messages.append(
                    {
                        "role": "assistant",
                        "content": reply.get("content") if isinstance(reply.get("content"), str) else None,
                        **({"tool_calls": [c.echo() for c in calls]} if calls else {}),
                    }
                )
                if not calls:
                    return AgentResult(True, str(reply.get("content") or "").strip()[:200])
                for call in calls:  # parallel tool calls run in order, each answered by its id
                    result = call.problem and {"error": call.problem}
                    if result is None:
                        result = self._tool(tools, call.name, call.arguments)
                    messages.append(
                        {"role": "tool", "tool_call_id": call.call_id, "content": json.dumps(result)[:20000]}
                    )
        except BudgetExhausted as exc:
            return AgentResult(False, str(exc))


@dataclass(frozen=True)
class _Call:
    call_id: str
    name: str
    arguments: Any  # a JSON string (OpenAI, vLLM, llama.cpp, Ollama's /v1) or an object (Ollama's /api)
    problem: str | None = None  # why the call cannot run

    def echo(self) -> dict[str, Any]:
        """The call as it goes back to the endpoint in the conversation (arguments as a JSON string)."""
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": args}}


def _message(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a chat completion, or MalformedReply."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedReply("the reply has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise MalformedReply("the reply's first choice has no message")
    return message


def _tool_calls(message: dict[str, Any]) -> list[_Call]:
    raw = message.get("tool_calls") or []
    if not isinstance(raw, list):
        raw = [raw]
    calls = []
    for n, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        call_id = str(call.get("id") or f"call_{n}") if isinstance(call, dict) else f"call_{n}"
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            calls.append(_Call(call_id, "", "{}", "the tool call has no function name"))
            continue
        calls.append(_Call(call_id, function["name"], function.get("arguments", "{}")))
    return calls
