"""The sample application's REST operations and their OpenAPI 3.1 document.

One table of operations drives the router, the OpenAPI document and the agents' ``discover`` tool, so
the three never disagree. The vocabulary is Plane's: "work item", never "issue".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRIORITIES = ("none", "low", "medium", "high", "urgent")


@dataclass(frozen=True)
class Param:
    name: str
    location: str  # "path" | "query" | "body"
    type: str  # JSON schema type: "integer", "string", "boolean", "array"
    description: str
    required: bool = False
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    summary: str
    description: str
    tag: str
    params: tuple[Param, ...] = ()
    status: int = 200

    @property
    def path_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.location == "path")

    @property
    def writes(self) -> bool:
        return self.method != "GET"


def _path(name: str, what: str) -> Param:
    return Param(name, "path", "integer", f"id of the {what}", required=True)


_PROJECT = _path("project_id", "project")
_WORK_ITEM = _path("work_item_id", "work item")
_WORK_ITEM_FIELDS = (
    Param("name", "body", "string", "title of the work item"),
    Param("description", "body", "string", "description of the work item (plain text)"),
    Param("priority", "body", "string", "priority of the work item", enum=PRIORITIES),
    Param("state_id", "body", "integer", "id of the workflow state (see listStates)"),
    Param(
        "assignee_ids",
        "body",
        "array",
        "member ids assigned to the work item; replaces the whole set (include current ones to keep them)",
    ),
    Param(
        "label_ids",
        "body",
        "array",
        "label ids of the work item; replaces the whole set (include the current ones to keep them)",
    ),
)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "listProjects",
        "GET",
        "/api/projects",
        "List projects",
        "List the projects of the workspace with their identifiers (e.g. PSP).",
        "projects",
    ),
    Operation(
        "getProject",
        "GET",
        "/api/projects/{project_id}",
        "Get a project",
        "Get one project by id.",
        "projects",
        (_PROJECT,),
    ),
    Operation(
        "listMembers",
        "GET",
        "/api/members",
        "List workspace members",
        "List the members (users) of the workspace: id, username, display name, role.",
        "members",
    ),
    Operation(
        "listProjectMembers",
        "GET",
        "/api/projects/{project_id}/members",
        "List project members",
        "List the members of one project.",
        "members",
        (_PROJECT,),
    ),
    Operation(
        "listStates",
        "GET",
        "/api/projects/{project_id}/states",
        "List workflow states",
        "List the workflow states of a project (Backlog, Todo, In Progress, Done, Cancelled) with ids.",
        "states",
        (_PROJECT,),
    ),
    Operation(
        "listLabels",
        "GET",
        "/api/projects/{project_id}/labels",
        "List labels",
        "List the labels of a project with their ids and colors.",
        "labels",
        (_PROJECT,),
    ),
    Operation(
        "createLabel",
        "POST",
        "/api/projects/{project_id}/labels",
        "Create a label",
        "Create a label in a project. The name must be unique within the project.",
        "labels",
        (
            _PROJECT,
            Param("name", "body", "string", "label name", required=True),
            Param("color", "body", "string", "hex color such as #8b5cf6"),
            Param("description", "body", "string", "what the label is for"),
        ),
        status=201,
    ),
    Operation(
        "updateLabel",
        "PATCH",
        "/api/labels/{label_id}",
        "Update a label",
        "Rename a label or change its color or description.",
        "labels",
        (
            _path("label_id", "label"),
            Param("name", "body", "string", "label name"),
            Param("color", "body", "string", "hex color such as #8b5cf6"),
            Param("description", "body", "string", "what the label is for"),
        ),
    ),
    Operation(
        "deleteLabel",
        "DELETE",
        "/api/labels/{label_id}",
        "Delete a label",
        "Delete a label; it is removed from every work item that has it.",
        "labels",
        (_path("label_id", "label"),),
        status=204,
    ),
    Operation(
        "listWorkItems",
        "GET",
        "/api/projects/{project_id}/work-items",
        "List work items",
        "List the work items of a project with state, priority, assignee ids and label ids."
        " Optional filters narrow the list.",
        "work items",
        (
            _PROJECT,
            Param("state_id", "query", "integer", "only work items in this state"),
            Param("label_id", "query", "integer", "only work items with this label"),
            Param("assignee_id", "query", "integer", "only work items assigned to this member"),
            Param("priority", "query", "string", "only work items with this priority", enum=PRIORITIES),
            Param("unassigned", "query", "boolean", "only work items without any assignee"),
        ),
    ),
    Operation(
        "getWorkItem",
        "GET",
        "/api/work-items/{work_item_id}",
        "Get a work item",
        "Get one work item with its assignees and labels.",
        "work items",
        (_WORK_ITEM,),
    ),
    Operation(
        "createWorkItem",
        "POST",
        "/api/projects/{project_id}/work-items",
        "Create a work item",
        "Create a work item in a project (defaults: Backlog, priority none).",
        "work items",
        (
            _PROJECT,
            *(
                p if p.name != "name" else Param("name", "body", "string", "title", required=True)
                for p in _WORK_ITEM_FIELDS
            ),
        ),
        status=201,
    ),
    Operation(
        "updateWorkItem",
        "PATCH",
        "/api/work-items/{work_item_id}",
        "Update a work item",
        "Change the name, description, priority or state of a work item, and optionally replace"
        " its assignees or labels. Fields left out stay as they are.",
        "work items",
        (_WORK_ITEM, *_WORK_ITEM_FIELDS),
    ),
    Operation(
        "deleteWorkItem",
        "DELETE",
        "/api/work-items/{work_item_id}",
        "Delete a work item",
        "Delete a work item with its assignee and label links.",
        "work items",
        (_WORK_ITEM,),
        status=204,
    ),
    Operation(
        "listWorkItemAssignees",
        "GET",
        "/api/work-items/{work_item_id}/assignees",
        "List assignees of a work item",
        "List the members assigned to a work item.",
        "assignees",
        (_WORK_ITEM,),
    ),
    Operation(
        "addWorkItemAssignee",
        "POST",
        "/api/work-items/{work_item_id}/assignees",
        "Assign a member to a work item",
        "Add one member to the assignees of a work item.",
        "assignees",
        (_WORK_ITEM, Param("member_id", "body", "integer", "id of the member", required=True)),
        status=201,
    ),
    Operation(
        "removeWorkItemAssignee",
        "DELETE",
        "/api/work-items/{work_item_id}/assignees/{member_id}",
        "Unassign a member from a work item",
        "Remove one member from the assignees of a work item.",
        "assignees",
        (_WORK_ITEM, _path("member_id", "member")),
        status=204,
    ),
    Operation(
        "listWorkItemLabels",
        "GET",
        "/api/work-items/{work_item_id}/labels",
        "List labels of a work item",
        "List the labels attached to a work item.",
        "work item labels",
        (_WORK_ITEM,),
    ),
    Operation(
        "addWorkItemLabel",
        "POST",
        "/api/work-items/{work_item_id}/labels",
        "Add a label to a work item",
        "Attach one label of the same project to a work item.",
        "work item labels",
        (_WORK_ITEM, Param("label_id", "body", "integer", "id of the label", required=True)),
        status=201,
    ),
    Operation(
        "removeWorkItemLabel",
        "DELETE",
        "/api/work-items/{work_item_id}/labels/{label_id}",
        "Remove a label from a work item",
        "Detach one label from a work item.",
        "work item labels",
        (_WORK_ITEM, _path("label_id", "label")),
        status=204,
    ),
)

BY_ID: dict[str, Operation] = {op.operation_id: op for op in OPERATIONS}


def _schema(param: Param) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": param.type}
    if param.type == "array":
        schema["items"] = {"type": "integer"}
    if param.enum:
        schema["enum"] = list(param.enum)
    return schema


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document served at ``/openapi.json``."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        entry: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "description": op.description,
            "tags": [op.tag],
            "parameters": [
                {
                    "name": p.name,
                    "in": p.location,
                    "required": p.required,
                    "description": p.description,
                    "schema": _schema(p),
                }
                for p in op.params
                if p.location != "body"
            ],
            "responses": {str(op.status): {"description": "success"}, "4XX": {"description": "error"}},
        }
        body = [p for p in op.params if p.location == "body"]
        if body:
            entry["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": [p.name for p in body if p.required],
                            "properties": {
                                p.name: {**_schema(p), "description": p.description} for p in body
                            },
                        }
                    }
                },
            }
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Paper Streets project tracker",
            "version": "1.0.0",
            "description": "A small project-management API modelled on Plane: projects, members, workflow"
            " states, labels and work items with assignees and labels.",
        },
        "paths": paths,
    }
