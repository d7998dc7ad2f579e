"""Shapes of the API's answers. Memory is integer bytes; times ISO 8601."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema


class Error(Schema):
    detail: str


ERRORS: dict[int, type[Schema]] = {400: Error, 401: Error, 403: Error, 404: Error, 422: Error}
READ_ERRORS: dict[int, type[Schema]] = {401: Error, 404: Error, 422: Error}


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
    node: str
    args: list[str]
    env: dict[str, str] = {}
    message: str = ""
    acknowledge_warnings: bool = False


class ValidateIn(Schema):
    node: str
    args: list[str]
    env: dict[str, str] = {}


class BudgetOut(Schema):
    verdict: str
    lines: list[str]
    messages: list[dict[str, str]]
    suggestion: dict[str, Any] | None = None


class LaunchIn(Schema):
    node: str
    profile: str | None = None
    command: str | None = None
    gpus: list[int] | None = None
    port: int | None = None
    overrides: dict[str, str] = {}
    timeout_s: int | None = None


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


class LogOut(Schema):
    lines: list[tuple[int, str]]
    last_seq: int
    ended: bool


class CleanupIn(Schema):
    launch: int | None = None
    gpus: list[int] | None = None
    include_foreign: list[int] = []


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
