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


class Role(models.TextChoices):
    """The three roles, each a Django group; each role can do all the roles before it can."""

    VIEWER = "viewer", "Viewer"  # sees everything, changes nothing
    OPERATOR = "operator", "Operator"  # launches, stops, cleans up, edits profiles
    ADMIN = "admin", "Admin"  # manages nodes, users, credentials


ROLE_ORDER = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)
