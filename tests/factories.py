"""Test data: one object per function, relations passed explicitly."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, Group

from nodes.domain.units import GB, GiB
from nodes.models import Gpu, Node

PASSWORD = "correct-horse-battery-staple"


def make_user(username: str, role: str | None) -> AbstractUser:
    user: AbstractUser = get_user_model().objects.create_user(username=username, password=PASSWORD)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


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
