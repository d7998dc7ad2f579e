"""Launches: the launch record, its log lines, its reservations; uploaded bundles."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from nodes.models.choices import LaunchStatus
from nodes.models.inventory import Node
from nodes.models.profiles import ProfileRevision


class Launch(models.Model):
    """One run of a profile revision on a node's GPUs, from pre-flight to its end.

    ``log_offset`` (bytes of the node's log stored) and ``last_seq`` (the last stored line) move
    together in one transaction, so a follower that restarts resumes with no gap or duplicate.
    """

    revision = models.ForeignKey(ProfileRevision, on_delete=models.PROTECT, related_name="launches")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="launches")
    # One server over several nodes (``--nnodes N``): node 0's launch is the group's (``group``
    # empty, the one operators see, stop and read the log of); each other node's part is a
    # launch of its own with ``group`` pointing at it and its ``node_rank`` (1 … N − 1). Each part
    # holds its node's GPUs, ports and commitment, and is followed on its node.
    group = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="parts"
    )
    node_rank = models.PositiveSmallIntegerField(default=0)
    # Where a group's nodes meet (``--dist-init-addr``: node 0's address and the store's port),
    # chosen at pre-flight from the nodes' interfaces; empty on one node.
    dist_init_addr = models.CharField(max_length=64, blank=True)
    gpus = models.JSONField(default=list, help_text="GPU indexes on the node, in rank order.")
    port = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=LaunchStatus, default=LaunchStatus.PENDING)
    reason = models.TextField(blank=True)
    checks = models.JSONField(default=list, blank=True)
    overrides = models.JSONField(default=dict, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    estimate = models.JSONField(null=True, blank=True)
    # Memory each reserved GPU held before the launch (bytes by index), as pre-flight read it.
    gpu_used_before = models.JSONField(null=True, blank=True)
    created_by = models.CharField(max_length=150)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended = models.DateTimeField(null=True, blank=True)
    startup_timeout_s = models.PositiveIntegerField()
    remote_dir = models.CharField(max_length=512, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    pgid = models.IntegerField(null=True, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    log_offset = models.PositiveBigIntegerField(default=0)
    last_seq = models.PositiveIntegerField(default=0)
    lines_dropped = models.PositiveIntegerField(default=0)
    # Every byte of the node's log is stored (set when the follower finishes after the end).
    log_complete = models.BooleanField(default=False)
    # The worker that follows the launch now, and when it last checked in (its lease).
    worker_token = models.CharField(max_length=64, blank=True)
    worker_beat = models.DateTimeField(null=True, blank=True)
    lost_since = models.DateTimeField(null=True, blank=True)
    resume_status = models.CharField(max_length=16, blank=True)
    # The stop in progress: who asked, how many attempts reached for the node, and the stop
    # task's lease (its id and when it last checked in, or when its next retry is due), so a
    # stop whose worker died is re-sent by the reconciler or by a second stop request.
    stop_by = models.CharField(max_length=150, blank=True)
    stop_attempts = models.PositiveSmallIntegerField(default=0)
    stop_token = models.CharField(max_length=64, blank=True)
    stop_beat = models.DateTimeField(null=True, blank=True)
    server_info = models.JSONField(null=True, blank=True)
    metrics = models.JSONField(null=True, blank=True)
    # The load gauges over the launch's life, bounded (domain.timeline.append): [{"t": s since
    # it started, "token_usage", "num_running_reqs", "num_queue_reqs", "gen_throughput", …}].
    metrics_series = models.JSONField(default=list, blank=True)
    health_at = models.DateTimeField(null=True, blank=True)
    snapshot = models.JSONField(null=True, blank=True)
    log_archive = models.BinaryField(null=True, blank=True)
    diagnosis = models.JSONField(
        null=True, blank=True, help_text="Why it failed: diagnosis.Diagnosis.to_json() + changes."
    )
    diagnosis_category = models.CharField(max_length=40, blank=True, db_index=True)
    memory_timeline = models.JSONField(
        default=list,
        blank=True,
        help_text='Samples during start-up: [{"t": s, "host_used_bytes", "gpus": {index: bytes}}].',
    )

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"launch #{self.pk} ({self.revision} on {self.node.name})"

    @property
    def adhoc(self) -> bool:
        return self.revision.profile.adhoc

    def gpu_list(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    def summary(self) -> dict[str, object]:
        """The launch as plain JSON for the CLI and audit entries."""
        return {
            "id": self.pk,
            "status": self.status,
            "reason": self.reason,
            "node": self.node.name,
            "profile": str(self.revision),
            "adhoc": self.adhoc,
            "gpus": list(self.gpus),
            "port": self.port,
            "phase": self.progress.get("phase", "") if isinstance(self.progress, dict) else "",
            "created": self.created.isoformat() if self.created else None,
            "ready_at": self.ready_at.isoformat() if self.ready_at else None,
            "ended": self.ended.isoformat() if self.ended else None,
            "diagnosis": (
                {k: self.diagnosis.get(k) for k in ("category", "summary", "remedy")}
                if isinstance(self.diagnosis, dict)
                else None
            ),
            **self._group_summary(),
        }

    def _group_summary(self) -> dict[str, object]:
        """A multi-node launch's nodes in rank order (node 0's launch), or the group it is a
        part of; nothing on one node."""
        if self.group_id is not None:
            return {"group": self.group_id, "node_rank": self.node_rank}
        if self.pk is None:
            return {}
        parts = list(self.parts.select_related("node").order_by("node_rank"))
        if not parts:
            return {}
        return {
            "nodes": [
                {
                    "node": p.node.name,
                    "node_rank": p.node_rank,
                    "launch": p.pk,
                    "status": p.status,
                    "gpus": list(p.gpus),
                    "port": p.port,
                }
                for p in [self, *parts]
            ],
            "dist_init_addr": self.dist_init_addr,
        }


class LaunchLogLine(models.Model):
    """One line of a launch's server log, cleaned and with secrets masked; ``seq`` counts from 1.
    ``level`` (0 information, 1 warning, 2 error) and ``rank`` (``"TP3"``, ``"DP1 TP3"`` or
    ``""``) are read from the text when stored (``domain.log_lines``), for the viewer's filters;
    ``node`` names the node in a multi-node launch, whose nodes' lines share one log."""

    launch = models.ForeignKey(Launch, on_delete=models.CASCADE, related_name="lines")
    seq = models.PositiveIntegerField()
    text = models.TextField()
    time = models.DateTimeField(auto_now_add=True)
    level = models.PositiveSmallIntegerField(default=0)
    rank = models.CharField(max_length=32, blank=True, default="")
    # The node that printed it, in a multi-node launch's one log (``""`` on one node).
    node = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["launch", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["launch", "seq"], name="log_line_seq_unique")
        ]
        indexes = [
            # Warnings and errors are few: a partial index finds them in a million lines.
            models.Index(
                fields=["launch", "seq"],
                condition=models.Q(level__gt=0),
                name="log_line_flagged",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.seq}: {self.text[:80]}"


class Reservation(models.Model):
    """A GPU or port of a node held by one launch; the unique constraint makes two launches on
    the same GPUs impossible, on SQLite as on PostgreSQL."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="reservations")
    kind = models.CharField(max_length=8, choices=[("gpu", "GPU"), ("port", "port")])
    number = models.PositiveIntegerField()
    launch = models.ForeignKey(Launch, on_delete=models.CASCADE, related_name="reservations")

    class Meta:
        ordering = ["node", "kind", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "kind", "number"], name="one_launch_per_resource"
            )
        ]

    def __str__(self) -> str:
        what = f"GPU {self.number}" if self.kind == "gpu" else f"port {self.number}"
        return f"{self.node.name} {what} → launch #{self.launch_id}"


class BundleUpload(models.Model):
    """A bundle uploaded to ``/diagnose/``, diagnosed by a worker, not by the web process.

    ``data`` holds the archive as uploaded (bounded by the form) until the worker read it;
    ``result`` then holds what the page shows: ``{"diagnosis", "summary", "excerpts",
    "line_count"}`` (secrets masked) or ``{"error": reason}``. Only ``owner`` sees it.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        REFUSED = "refused"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bundle_uploads"
    )
    name = models.CharField(max_length=200)
    data = models.BinaryField(default=b"")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class Commitment(models.Model):
    """What a launch holds on its node from its submission until its processes are gone and
    its memory is back: the host memory it pins (its host pools over its ranks there, plus
    pinned buffers) and the device memory it takes per GPU. Its GPUs and ports are its
    ``Reservation`` rows, taken in the same transaction."""

    launch = models.OneToOneField(Launch, on_delete=models.CASCADE, related_name="commitment")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="commitments")
    host_bytes = models.PositiveBigIntegerField(default=0)
    # GPU index → bytes the launch takes there (None where the estimate is unknown).
    device_bytes = models.JSONField(default=dict, blank=True)
    # The launch's log showed its host pools allocated: MemAvailable counts them from then on.
    pinned = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)
    released = models.DateTimeField(null=True, blank=True, db_index=True)

    def __str__(self) -> str:
        return f"launch #{self.launch_id}'s commitment on {self.node.name}"
