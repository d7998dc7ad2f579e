"""Launch profiles: revisions, known-good stamps and calibrations."""

from __future__ import annotations

import shlex

from django.db import models

from nodes.domain.redact import redact_args, redact_env
from nodes.models.accounts import Team
from nodes.models.inventory import Node


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


class KnownGoodStamp(models.Model):
    """A revision that launched on a node, reached ``ready`` and stayed healthy for the
    known-good window: where, on what hardware, and what it really used beside the estimate."""

    revision = models.ForeignKey(ProfileRevision, on_delete=models.CASCADE, related_name="stamps")
    node = models.ForeignKey(Node, null=True, on_delete=models.SET_NULL, related_name="stamps")
    node_name = models.CharField(max_length=63)
    launch = models.OneToOneField(
        "nodes.Launch", null=True, blank=True, on_delete=models.SET_NULL, related_name="stamp"
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
    # A stamp that came in an import was earned elsewhere (or typed into the document): it is
    # shown as imported and never counts as known-good here.
    imported_at = models.DateTimeField(null=True, blank=True)
    imported_from = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-stamped_at", "-id"]

    def __str__(self) -> str:
        said = "imported as known-good" if self.imported_at else "known-good"
        return f"{self.revision} {said} on {self.node_name}"

    @property
    def gpu_class(self) -> str:
        """``8 × NVIDIA H200 (96 GiB)``: what "known-good on this GPU class" compares."""
        return f"{self.gpu_count} × {self.gpu_name} ({round(self.gpu_memory_bytes / 2**30)} GiB)"


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
        "nodes.Launch",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="calibrations",
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
    # The settings the pool's size depended on in that run (calibration.POOL_SETTINGS, as
    # text): its token count is compared only with an estimate for the same; {} not recorded.
    pool_settings = models.JSONField(default=dict, blank=True)
    # The fullest chosen GPU's memory in use before the launch: free memory before load then.
    gpu_used_before_bytes = models.PositiveBigIntegerField(default=0)
    ranks = models.JSONField(default=list, blank=True, help_text="Per-rank figures as logged.")
    created_by = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    # A pasted log calibrates only its own profile until an admin promotes it to the whole
    # fleet; a launch's own start-up calibrates the fleet at once (``fleet_wide``).
    promoted_by = models.CharField(max_length=150, blank=True)
    promoted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"calibration of {self.model_path} ({self.gpu_name}, TP{self.tp_size})"

    @property
    def fleet_wide(self) -> bool:
        """Whether it calibrates every profile of its model × GPU × TP, not only its own."""
        return self.launch_id is not None or self.promoted_at is not None
