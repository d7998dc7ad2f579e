"""Test data: one object per function, relations passed explicitly."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, Group

from nodes.domain.log_lines import level_of, rank_of
from nodes.domain.units import GB, GiB
from nodes.models import Gpu, Launch, LaunchLogLine, LaunchProfile, Node, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.workflows.diagnosing import diagnose_launch

PASSWORD = "correct-horse-battery-staple"


def make_user(username: str, role: str | None) -> AbstractUser:
    user: AbstractUser = get_user_model().objects.create_user(username=username, password=PASSWORD)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def logs_in(client: Any, username: str, password: str) -> bool:
    """Log in through the login form, as a person does (the brute-force protection counts
    it); True when the panel let them in."""
    from django.urls import reverse

    client.post(reverse("login"), {"username": username, "password": password})
    return "_auth_user_id" in client.session


def make_node(name: str = "gpu-01", *, gpus: int = 8, **fields: Any) -> Node:
    fields.setdefault("host", "10.0.0.5")
    fields.setdefault("host_ram_bytes", 449 * GB)
    node = Node.objects.create(name=name, **fields)
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, name="NVIDIA H200", memory_total_bytes=96 * GiB)
        for i in range(gpus)
    )
    return node


def node_form_data(**overrides: Any) -> dict[str, Any]:
    """A valid node form submission; override any input by its HTML name."""
    data: dict[str, Any] = {
        "name": "gpu-01",
        "host": "gpu-01.example.net",
        "port": "22",
        "ssh_user": "root",
        "credential": "",
        "sglang_python": "python3",
        "gpu_count": "8",
        "gpu_name": "NVIDIA H200",
        "gpu_memory_0": "96",
        "gpu_memory_1": "GiB",
        "host_ram_0": "449",
        "host_ram_1": "GB",
        "labels_text": "rack=a3, h200",
        "notes": "",
    }
    data.update(overrides)
    return data


def make_failed(node, args, lines, *, name="kimi", **fields) -> Launch:
    profile, _ = LaunchProfile.objects.get_or_create(name=name, defaults={"created_by": "olga"})
    revision = ProfileRevision.objects.create(
        profile=profile,
        number=profile.revisions.count() + 1,
        args=args,
        env={},
        author="olga",
        node=node,
        verdict="block",
        report={},
    )
    launch = Launch.objects.create(
        revision=revision,
        node=node,
        gpus=list(range(8)),
        port=30000,
        created_by="olga",
        startup_timeout_s=60,
        status=LaunchStatus.FAILED,
        exit_status=-9,
        reason="sglang::scheduler_TP3 (PID 41) died during start-up",
        last_seq=len(lines),
        log_complete=True,
        **fields,
    )
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(launch=launch, seq=i, text=t, level=level_of(t), rank=rank_of(t))
        for i, t in enumerate(lines, 1)
    )
    diagnose_launch(launch.pk)
    launch.refresh_from_db()
    return launch


def pool_lines(size: int, ranks: int = 8) -> list[str]:
    head = ["[2026-12-01 10:00:00] server_args=ServerArgs(...)", "Load weight end."]
    return head + [
        f"[2026-12-01 10:01:0{r} TP{r}] Allocating {size:.2f} GB host memory for hierarchical "
        "KV cache."
        for r in range(ranks)
    ]


def profile_form_data(node: Any, **overrides: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "kimi-tp8",
        "node": node.pk,
        "model_path": "/models/kimi",
        "tp_size": "8",
        "pp_size": "1",
        "dp_size": "1",
        "mem_fraction_static": "0.93",
        "kv_cache_dtype": "auto",
        "port": "30000",
        "enable_hicache": "on",
        "hicache_size": "300",
        "extra_flags": "",
        "env": "",
        "model_config": "",
        "message": "",
        "action": "save",
    }
    data.update(overrides)
    return data
