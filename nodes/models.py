"""Inventory and audit records."""

from __future__ import annotations

import shlex
import uuid
from typing import Any

from django.conf import settings
from django.db import models

from nodes.choices import LaunchStatus, NodeStatus
from nodes.domain.inventory import GpuSpec, gpu_summary
from nodes.domain.redact import redact_args, redact_env


class SshCredential(models.Model):
    """An SSH private key, encrypted at rest with RANKWISE_ENCRYPTION_KEY; never shown again."""

    name = models.CharField(max_length=63, unique=True)
    key_type = models.CharField(max_length=32)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=64)
    encrypted_private_key = models.BinaryField()
    encrypted_passphrase = models.BinaryField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_type} {self.fingerprint})"

    def audit_snapshot(self) -> dict[str, object]:
        return {"name": self.name, "key_type": self.key_type, "fingerprint": self.fingerprint}


class Node(models.Model):
    """A GPU machine Rankwise reaches over SSH."""

    name = models.CharField(max_length=63, unique=True)
    host = models.CharField("SSH host", max_length=253)
    port = models.PositiveIntegerField("SSH port", default=22)
    ssh_user = models.CharField("SSH user", max_length=32, default="root")
    credential = models.ForeignKey(
        SshCredential,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="nodes",
        verbose_name="SSH key",
    )
    sglang_python = models.CharField(
        "SGLang Python",
        max_length=1024,
        default="python3",
        help_text="The interpreter that has SGLang installed, e.g. /opt/sglang/.venv/bin/python.",
    )
    # Who launched servers run as on the node (blank: the SSH user); see launchctl.py.
    run_as_user = models.CharField(
        "Run servers as",
        max_length=32,
        blank=True,
        help_text="An unprivileged user on the node that SGLang servers run as (the SSH user "
        "must be root to switch to it). Blank: the SSH user.",
    )
    # Environment variable names (or NAME_* prefixes) the policy refuses but an admin allows here.
    allowed_env = models.JSONField("Allowed environment variables", default=list, blank=True)
    # The host key an admin trusted ("ssh-ed25519 AAAA…"); an empty one means never trusted.
    host_key = models.TextField(blank=True)
    host_key_fingerprint = models.CharField(max_length=64, blank=True)
    # A key seen on first contact, waiting for an admin to trust it.
    offered_host_key = models.TextField(blank=True)
    offered_host_key_fingerprint = models.CharField(max_length=64, blank=True)
    host_ram_bytes = models.PositiveBigIntegerField("host RAM (bytes)", null=True, blank=True)
    mem_available_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    sglang_version = models.CharField(max_length=32, blank=True)
    facts = models.JSONField(null=True, blank=True)
    status_reason = models.TextField(blank=True)
    last_discovered = models.DateTimeField(null=True, blank=True)
    labels = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=NodeStatus, default=NodeStatus.UNKNOWN)
    last_seen = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(port__gte=1, port__lte=65535), name="node_port_in_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def server_user(self) -> str:
        """Who launched servers run as: the run-as user, else the SSH user."""
        return self.run_as_user or self.ssh_user

    def gpu_specs(self) -> list[GpuSpec]:
        return [GpuSpec(g.index, g.name, g.memory_total_bytes) for g in self.gpus.all()]

    def gpu_summary(self) -> str:
        return gpu_summary(self.gpu_specs())

    def audit_snapshot(self) -> dict[str, object]:
        """The node's facts as plain JSON, for audit before/after and the CLI."""
        return {
            "name": self.name,
            "host": self.host,
            "port": self.port,
            "user": self.ssh_user,
            "credential": self.credential.name if self.credential else None,
            "sglang_python": self.sglang_python,
            "run_as_user": self.run_as_user or None,
            "allowed_env": list(self.allowed_env or []),
            "host_key_fingerprint": self.host_key_fingerprint or None,
            "host_ram_bytes": self.host_ram_bytes,
            "gpus": [
                {"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes}
                for g in self.gpu_specs()
            ],
            "labels": list(self.labels) if isinstance(self.labels, list) else [],
            "notes": self.notes,
            "status": self.status,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
        }


class Gpu(models.Model):
    """One GPU of a node, by its index on that node."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=128)
    memory_total_bytes = models.PositiveBigIntegerField("memory total (bytes)")
    memory_used_bytes = models.PositiveBigIntegerField("memory used (bytes)", null=True, blank=True)
    uuid = models.CharField("UUID", max_length=64, blank=True)
    processes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name} GPU {self.index}"

    @property
    def quarantine(self) -> GpuQuarantine | None:
        """The quarantine in force on this GPU, if any (it outlives the row: discovery replaces
        GPU rows)."""
        return GpuQuarantine.objects.filter(
            node_id=self.node_id, index=self.index, lifted_at__isnull=True
        ).first()


class NodeEvent(models.Model):
    """Something that happened to a node: a change found by discovery, lost or regained contact."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=32)
    message = models.TextField()

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{self.node.name} {self.kind}: {self.message}"


class AuditEntry(models.Model):
    """One recorded action: who did what to which object, with the state before and after."""

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Kept apart from the foreign key so the record survives the user's deletion, and so failed
    # logins (no user) still say which name was tried.
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.object_repr}"


class Team(models.Model):
    """A named group of users that owns profiles, and is told (webhook, e-mail) when their
    launches become ready, fail, get lost, or leave GPUs quarantined."""

    name = models.CharField(max_length=63, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="teams", blank=True)
    webhook_url = models.URLField(blank=True, help_text="POSTed a JSON event; empty: none.")
    email = models.EmailField(blank=True, help_text="Also e-mailed when e-mail is configured.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class LaunchProfile(models.Model):
    """A named SGLang launch configuration; its content lives in immutable revisions."""

    class Visibility(models.TextChoices):
        EVERYONE = "everyone", "Everyone"
        TEAM = "team", "Its team only"

    name = models.CharField(max_length=63, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150)
    # Made for one launch from a raw command line (CLI `-- COMMAND` or pasted), not by an editor.
    adhoc = models.BooleanField(default=False)
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="profiles"
    )
    visibility = models.CharField(max_length=8, choices=Visibility, default=Visibility.EVERYONE)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def latest(self) -> ProfileRevision | None:
        return self.revisions.order_by("-number").first()


class ProfileRevision(models.Model):
    """One saved version of a profile: the exact flags and environment, never edited."""

    profile = models.ForeignKey(LaunchProfile, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    args = models.JSONField(help_text="The flags after `python3 -m sglang.launch_server`.")
    env = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True)
    author = models.CharField(max_length=150)
    created = models.DateTimeField(auto_now_add=True)
    # What it was checked against when saved.
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    sglang_version = models.CharField(max_length=32, blank=True)
    verdict = models.CharField(max_length=8)
    report = models.JSONField()
    geometry_source = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["profile", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["profile", "number"], name="revision_number_unique")
        ]

    def __str__(self) -> str:
        return f"{self.profile.name}@{self.number}"

    def command_line(self) -> str:
        """The command that will run on the node (env first), shell-quoted, secrets masked."""
        env = [f"{k}={v}" for k, v in sorted(redact_env(self.env).items())]
        return shlex.join([*env, "python3", "-m", "sglang.launch_server", *redact_args(self.args)])


class Launch(models.Model):
    """One run of a profile revision on a node's GPUs, from pre-flight to its end.

    ``log_offset`` (bytes of the node's log stored) and ``last_seq`` (the last stored line) move
    together in one transaction, so a follower that restarts resumes with no gap or duplicate.
    """

    revision = models.ForeignKey(ProfileRevision, on_delete=models.PROTECT, related_name="launches")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="launches")
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
        }


class LaunchLogLine(models.Model):
    """One line of a launch's server log, cleaned and with secrets masked; ``seq`` counts from 1."""

    launch = models.ForeignKey(Launch, on_delete=models.CASCADE, related_name="lines")
    seq = models.PositiveIntegerField()
    text = models.TextField()
    time = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["launch", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["launch", "seq"], name="log_line_seq_unique")
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


class Cleanup(models.Model):
    """One recovery of a node's GPUs: escalating steps, each recorded with what it ran, what it
    answered and the memory before and after."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        ERROR = "error", "Error"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="cleanups")
    launch = models.ForeignKey(
        Launch, null=True, blank=True, on_delete=models.SET_NULL, related_name="cleanups"
    )
    gpus = models.JSONField(default=list, help_text="GPU indexes the cleanup is about.")
    foreign_pids = models.JSONField(
        default=list, blank=True, help_text="Other holders the operator confirmed by PID."
    )
    requested_by = models.CharField(max_length=150)
    status = models.CharField(max_length=8, choices=Status, default=Status.RUNNING)
    message = models.TextField(blank=True)
    result = models.JSONField(
        null=True, blank=True, help_text='{"gpus": [GpuState.to_json()], "host": {...}}'
    )
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"cleanup #{self.pk} of {self.node.name}"

    def all_free(self) -> bool:
        gpus = (self.result or {}).get("gpus") or []
        return bool(gpus) and all(g.get("state") == "free" for g in gpus)

    def to_json(self) -> dict[str, Any]:
        """The cleanup for the CLI and the API: its steps with their commands, outputs and
        measurements, then each GPU's final state and the host's memory."""
        return {
            "id": self.pk,
            "node": self.node.name,
            "launch": self.launch_id,
            "gpus_asked": list(self.gpus),
            "status": self.status,
            "message": self.message,
            "steps": [
                {
                    "key": s.key,
                    "title": s.title,
                    "outcome": s.outcome,
                    "command": s.command,
                    "output": s.output,
                    "before": s.before,
                    "after": s.after,
                }
                for s in self.steps.all()
            ],
            "gpus": (self.result or {}).get("gpus", []),
            "host": (self.result or {}).get("host", {}),
        }


class CleanupStep(models.Model):
    """One step of a cleanup (``key`` a–h): the command run, its output, the measurements."""

    cleanup = models.ForeignKey(Cleanup, on_delete=models.CASCADE, related_name="steps")
    number = models.PositiveSmallIntegerField()
    key = models.CharField(max_length=1)
    title = models.CharField(max_length=200)
    outcome = models.CharField(max_length=16, help_text="done, nothing to do, failed, skipped")
    command = models.TextField(blank=True)
    output = models.TextField(blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    started = models.DateTimeField()
    finished = models.DateTimeField()

    class Meta:
        ordering = ["cleanup", "number"]

    def __str__(self) -> str:
        return f"{self.key}. {self.title}: {self.outcome}"


class GpuQuarantine(models.Model):
    """A GPU no launch may use: memory held with no process and no reset possible. Lifted only
    when a discovery finds its memory free again (after the node's reboot)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="quarantines")
    index = models.PositiveSmallIntegerField()
    reason = models.TextField()
    since = models.DateTimeField(auto_now_add=True)
    cleanup = models.ForeignKey(Cleanup, null=True, blank=True, on_delete=models.SET_NULL)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_because = models.TextField(blank=True)

    class Meta:
        ordering = ["node", "index", "-since"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=models.Q(lifted_at__isnull=True),
                name="one_active_quarantine_per_gpu",
            )
        ]

    def __str__(self) -> str:
        return f"{self.node.name} GPU {self.index} quarantined"


class KnownGoodStamp(models.Model):
    """A revision that launched on a node, reached ``ready`` and stayed healthy for the
    known-good window: where, on what hardware, and what it really used beside the estimate."""

    revision = models.ForeignKey(ProfileRevision, on_delete=models.CASCADE, related_name="stamps")
    node = models.ForeignKey(Node, null=True, on_delete=models.SET_NULL, related_name="stamps")
    node_name = models.CharField(max_length=63)
    launch = models.OneToOneField(
        Launch, null=True, blank=True, on_delete=models.SET_NULL, related_name="stamp"
    )
    gpu_name = models.CharField(max_length=128, help_text="The GPU model, e.g. NVIDIA H200.")
    gpu_count = models.PositiveSmallIntegerField(help_text="GPUs the launch used.")
    gpu_memory_bytes = models.PositiveBigIntegerField(help_text="Memory of one GPU.")
    host_ram_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    sglang_version = models.CharField(max_length=32, blank=True)
    launched_by = models.CharField(max_length=150)
    stamped_at = models.DateTimeField(db_index=True)
    healthy_seconds = models.PositiveIntegerField()
    observed = models.JSONField(
        default=dict,
        help_text='{"gpu_used_bytes": {index: bytes}, "host_pool_bytes_per_rank", '
        '"max_total_num_tokens"}',
    )
    estimate = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-stamped_at", "-id"]

    def __str__(self) -> str:
        return f"{self.revision} known-good on {self.node_name}"

    @property
    def gpu_class(self) -> str:
        """``8 × NVIDIA H200 (96 GiB)``: what "known-good on this GPU class" compares."""
        return f"{self.gpu_count} × {self.gpu_name} ({round(self.gpu_memory_bytes / 2**30)} GiB)"


class ApiToken(models.Model):
    """A user's token for the JSON API: only its SHA-256 is kept (the token is shown once)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, help_text="The token's first characters, to tell it.")
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Calibration(models.Model):
    """What a real start-up logged for a model folder on a GPU model at a TP size (free memory
    before weights, weights per rank, device KV tokens): later estimates for the same three use
    these figures instead of estimating them (``nodes.services.calibrations``)."""

    model_path = models.CharField(max_length=1024, db_index=True)
    gpu_name = models.CharField(max_length=128, help_text="The GPU model, e.g. NVIDIA H200.")
    tp_size = models.PositiveSmallIntegerField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="calibrations"
    )
    node_name = models.CharField(max_length=63, blank=True)
    launch = models.ForeignKey(
        Launch, null=True, blank=True, on_delete=models.SET_NULL, related_name="calibrations"
    )
    profile = models.ForeignKey(
        LaunchProfile,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="calibrations",
    )
    source = models.CharField(max_length=200, help_text='"launch #12 on node-b", "pasted log"')
    free_before_load_bytes = models.PositiveBigIntegerField()
    weights_per_rank_bytes = models.PositiveBigIntegerField()
    kv_tokens = models.BigIntegerField(null=True, blank=True)
    # The fullest chosen GPU's memory in use before the launch: free memory before load then.
    gpu_used_before_bytes = models.PositiveBigIntegerField(default=0)
    ranks = models.JSONField(default=list, blank=True, help_text="Per-rank figures as logged.")
    created_by = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"calibration of {self.model_path} ({self.gpu_name}, TP{self.tp_size})"


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
