"""GPU cleanups and their recorded steps."""

from __future__ import annotations

from typing import Any

from django.db import models

from nodes.models.inventory import Node
from nodes.models.launches import Launch


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
    # PID → start time (clock ticks after boot) of each confirmed holder, as the page the
    # operator ticked them on read them: a PID reused by another process since is not killed.
    foreign_starts = models.JSONField(default=dict, blank=True)
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
