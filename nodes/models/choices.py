"""Enumerations shared by models, forms and templates."""

from __future__ import annotations

from django.db import models


class NodeStatus(models.TextChoices):
    """Where a node stands, as the panel last learned it."""

    # Registered but never contacted: nothing is known beyond what was typed in.
    UNKNOWN = "unknown", "Not contacted yet"
    # Reachable, GPUs detected, ready for launches.
    READY = "ready", "Ready"
    # Reachable, but something is wrong (e.g. GPUs not detected); the reason is shown.
    DEGRADED = "degraded", "Degraded"
    # The last contact failed; last-seen says when it last answered.
    UNREACHABLE = "unreachable", "Unreachable"
    # Taken out of service by an admin: no launches.
    MAINTENANCE = "maintenance", "Maintenance"
    # The node presents another host key than the trusted one: nothing runs on it (launches
    # there are left as they are) until an admin trusts the new key.
    HOST_KEY_CHANGED = "host_key_changed", "Host key changed"


class Role(models.TextChoices):
    """The three roles, each a Django group; each role can do all the roles before it can."""

    VIEWER = "viewer", "Viewer"  # sees everything, changes nothing
    OPERATOR = "operator", "Operator"  # launches, stops, cleans up, edits profiles
    ADMIN = "admin", "Admin"  # manages nodes, users, credentials


ROLE_ORDER = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


class LaunchStatus(models.TextChoices):
    """A launch's life: pending → preflight → starting → loading → ready → stopping → stopped,
    or blocked (pre-flight refused), failed, error (the panel broke), lost (node unreachable)."""

    PENDING = "pending", "Pending"
    PREFLIGHT = "preflight", "Pre-flight"
    STARTING = "starting", "Starting"
    LOADING = "loading", "Loading"
    READY = "ready", "Ready"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    BLOCKED = "blocked", "Blocked"
    FAILED = "failed", "Failed"
    ERROR = "error", "Error"
    LOST = "lost", "Lost"


#: The server may be running: followed, health-checked, re-adopted after a restart.
LAUNCH_RUNNING = (
    LaunchStatus.STARTING,
    LaunchStatus.LOADING,
    LaunchStatus.READY,
    LaunchStatus.STOPPING,
    LaunchStatus.LOST,
)
LAUNCH_ACTIVE = (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT, *LAUNCH_RUNNING)
LAUNCH_ENDED = (LaunchStatus.STOPPED, LaunchStatus.BLOCKED, LaunchStatus.FAILED, LaunchStatus.ERROR)
