"""The panel's records, by feature; every model is importable from ``nodes.models``."""

from __future__ import annotations

from nodes.models.accounts import ApiToken, AuditEntry, Team
from nodes.models.cleanups import Cleanup, CleanupStep
from nodes.models.inventory import Gpu, GpuQuarantine, ModelReading, Node, NodeEvent, SshCredential
from nodes.models.launches import BundleUpload, Commitment, Launch, LaunchLogLine, Reservation
from nodes.models.profiles import Calibration, KnownGoodStamp, LaunchProfile, ProfileRevision

__all__ = [
    "ApiToken",
    "AuditEntry",
    "BundleUpload",
    "Calibration",
    "Cleanup",
    "CleanupStep",
    "Commitment",
    "Gpu",
    "GpuQuarantine",
    "KnownGoodStamp",
    "Launch",
    "LaunchLogLine",
    "LaunchProfile",
    "ModelReading",
    "Node",
    "NodeEvent",
    "ProfileRevision",
    "Reservation",
    "SshCredential",
    "Team",
]
