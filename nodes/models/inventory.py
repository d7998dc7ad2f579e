"""Inventory: nodes, their SSH keys, GPUs, events and GPU quarantines."""

from __future__ import annotations

from django.db import models

from nodes.domain.inventory import GpuSpec, gpu_summary
from nodes.models.choices import NodeStatus


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


class GpuQuarantine(models.Model):
    """A GPU no launch may use: memory held with no process and no reset possible. Lifted only
    when a discovery finds its memory free again (after the node's reboot)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="quarantines")
    index = models.PositiveSmallIntegerField()
    reason = models.TextField()
    since = models.DateTimeField(auto_now_add=True)
    cleanup = models.ForeignKey("nodes.Cleanup", null=True, blank=True, on_delete=models.SET_NULL)
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


class ModelReading(models.Model):
    """What the node agent read of a model folder on a node (config.json, checkpoint size,
    safetensors header groups, the folder's stamp), or why it could not: the budget's model
    geometry. Read by a worker; pages only look here, they never wait on the node."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="model_readings")
    model_path = models.CharField(max_length=1024)
    # The node's address when it was read: a node moved to another host is read again.
    host = models.CharField(max_length=253)
    answer = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    # When a read was last queued, so one page's polls do not queue one read each.
    requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "model_path"], name="one_reading_per_model")
        ]

    def __str__(self) -> str:
        return f"{self.model_path} on {self.node.name}"
