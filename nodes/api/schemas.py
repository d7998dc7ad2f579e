"""Shapes of the API's answers. Memory is integer bytes; times ISO 8601."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema


class Error(Schema):
    detail: str


ERRORS: dict[int, type[Schema]] = {400: Error, 401: Error, 403: Error, 404: Error, 422: Error}
READ_ERRORS: dict[int, type[Schema]] = {400: Error, 401: Error, 404: Error, 422: Error}


class GpuOut(Schema):
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None = None


class NodeOut(Schema):
    id: int
    name: str
    host: str
    status: str
    status_reason: str
    sglang_version: str
    host_ram_bytes: int | None = None
    mem_available_bytes: int | None = None
    last_seen: datetime | None = None
    gpus: list[GpuOut]


class Accepted(Schema):
    detail: str
    id: str | int | None = None


class StampOut(Schema):
    node: str
    gpu_name: str
    gpu_count: int
    gpu_memory_bytes: int
    host_ram_bytes: int | None = None
    sglang_version: str
    launched_by: str
    stamped_at: datetime
    healthy_seconds: int
    observed: dict[str, Any]
    estimate: dict[str, Any] | None = None
    #: Set for a stamp that came in an import: not earned on this panel.
    imported_at: datetime | None = None
    imported_from: str = ""


class RevisionOut(Schema):
    number: int
    args: list[str]
    env: dict[str, str]
    message: str
    author: str
    created: datetime
    node: str | None = None
    sglang_version: str
    verdict: str
    stamps: list[StampOut]


class ProfileOut(Schema):
    id: int
    name: str
    created_by: str
    team: str | None = None
    visibility: str
    revisions: list[RevisionOut]


class RevisionIn(Schema):
    node: str = Field(..., max_length=63)
    args: list[str] = Field(..., max_length=2000, description="Flags after the launcher.")
    env: dict[str, str] = Field(default_factory=dict, max_length=200)
    message: str = Field("", max_length=500)
    acknowledge_warnings: bool = False


class ValidateIn(Schema):
    node: str = Field(..., max_length=63)
    args: list[str] = Field(..., max_length=2000, description="Flags after the launcher.")
    env: dict[str, str] = Field(default_factory=dict, max_length=200)


class BudgetOut(Schema):
    verdict: str
    lines: list[str]
    messages: list[dict[str, str]]
    suggestion: dict[str, Any] | None = None
    #: What the suggestion costs: kv_tokens_before/after (per rank), requests_before/after of
    #: request_tokens at once, and the sentence ("text"); "unavailable" said there when unknown.
    suggestion_cost: dict[str, Any] | None = None
    #: Other changes the check passes (removing HiCache): change, verdict, kv_tokens_per_rank,
    #: cost, text.
    alternatives: list[dict[str, Any]] = []


class CandidateOut(Schema):
    node: str
    gpus: list[int]
    verdict: str
    headroom_bytes: int
    reasons: list[str]


class RefusedOut(Schema):
    node: str
    reasons: list[str]


class PlacementOut(Schema):
    revision: str
    candidates: list[CandidateOut]
    refused: list[RefusedOut]


class LaunchIn(Schema):
    # One node's name, or a multi-node launch's names in rank order: "a,b" (node 0 first).
    node: str = Field(..., max_length=1023)
    profile: str | None = Field(None, max_length=80)
    command: str | None = Field(None, max_length=65536)
    gpus: list[int] | None = Field(None, max_length=64)
    port: int | None = Field(None, ge=1, le=65535)
    overrides: dict[str, str] = Field(default_factory=dict, max_length=16)
    timeout_s: int | None = Field(None, ge=1, le=7 * 24 * 3600)


class LaunchOut(Schema):
    id: int
    status: str
    reason: str
    node: str
    profile: str
    adhoc: bool
    gpus: list[int]
    port: int
    phase: str
    created: str | None = None
    ready_at: str | None = None
    ended: str | None = None
    checks: list[dict[str, Any]]
    diagnosis: dict[str, Any] | None = None
    # A multi-node launch: its nodes in rank order ({"node", "node_rank", "launch", "status",
    # "gpus", "port"}) and where they meet; a node's part names its group and node rank.
    nodes: list[dict[str, Any]] | None = None
    dist_init_addr: str | None = None
    group: int | None = None
    node_rank: int | None = None


class LogOut(Schema):
    lines: list[tuple[int, str]]
    last_seq: int
    ended: bool


class CleanupIn(Schema):
    launch: int | None = Field(None, ge=1, le=2**62)
    gpus: list[int] | None = Field(None, max_length=64)
    include_foreign: list[int] = Field(default_factory=list, max_length=64)


class CleanupOut(Schema):
    id: int
    node: str
    launch: int | None = None
    gpus_asked: list[int]
    status: str
    message: str
    steps: list[dict[str, Any]]
    gpus: list[dict[str, Any]]
    host: dict[str, Any]
