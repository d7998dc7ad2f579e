"""Inventory forms: nodes and SSH keys, checked with the domain rules; no I/O beyond ``save()``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import transaction

from nodes.domain import inventory as rules
from nodes.domain.env_policy import parse_allowances
from nodes.domain.units import kept_if_unchanged
from nodes.forms.fields import SecretTextarea, SizeField, StrictIntegerField
from nodes.models import Gpu, Node, SshCredential


class CredentialForm(forms.Form):
    """An SSH private key, pasted or uploaded; it is checked, encrypted and never shown again."""

    name = forms.CharField(max_length=63, help_text="e.g. fleet-a-root")
    private_key = forms.CharField(
        label="Private key (paste)",
        required=False,
        strip=False,
        widget=SecretTextarea(attrs={"rows": 6, "autocomplete": "off", "spellcheck": "false"}),
        help_text="OpenSSH or PEM: ed25519, ECDSA or RSA.",
    )
    key_file = forms.FileField(label="…or upload the key file", required=False)
    passphrase = forms.CharField(
        required=False, strip=False, widget=forms.PasswordInput(attrs={"autocomplete": "off"})
    )

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if message := rules.check_node_name(name):
            raise forms.ValidationError(message)
        if SshCredential.objects.filter(name=name).exists():
            raise forms.ValidationError("A key with this name exists already.")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        upload = data.get("key_file")
        text = data.get("private_key") or ""
        if upload:
            if upload.size > 64 * 1024:
                self.add_error("key_file", "That file is too large to be an SSH private key.")
                return data
            text = upload.read().decode(errors="replace")
        if not text.strip():
            self.add_error("private_key", "Paste the private key or upload its file.")
        data["key_text"] = text
        return data


class NodeForm(forms.ModelForm[Node]):
    """Create or edit a node by hand: SSH address, GPUs (count × model × memory), host RAM."""

    port = StrictIntegerField(
        label="SSH port", initial=22, widget=forms.NumberInput(attrs={"min": 1, "max": 65535})
    )
    gpu_count = StrictIntegerField(
        label="GPU count", min_value=0, max_value=rules.MAX_GPUS_PER_NODE, initial=0
    )
    gpu_name = forms.CharField(label="GPU model", max_length=128, required=False)
    gpu_memory = SizeField(
        label="Memory per GPU",
        required=False,
        help_text="GiB = 2^30 bytes (what nvidia-smi reports, in MiB); GB = 10^9 bytes.",
    )
    host_ram = SizeField(label="Host RAM", required=False, help_text="Total RAM of the node.")
    labels_text = forms.CharField(
        label="Labels", required=False, help_text="Comma-separated, e.g. rack=a3, h200."
    )
    allowed_env_text = forms.CharField(
        label="Allowed environment variables",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text="Names (or NAME_* prefixes) the environment policy refuses but profiles may "
        "set on this node, e.g. LD_LIBRARY_PATH, NCCL_NET_PLUGIN. Each one can run code of its "
        "own in the server: allow only what this node needs.",
    )

    class Meta:
        model = Node
        fields = [
            "name",
            "host",
            "port",
            "ssh_user",
            "run_as_user",
            "credential",
            "sglang_python",
            "notes",
        ]
        widgets = {"notes": forms.Textarea(attrs={"rows": 3})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        node = self.instance
        # Taken now: validation writes the new values onto the instance.
        self.snapshot_before = node.audit_snapshot() if node.pk else None
        if node.pk:
            specs = node.gpu_specs()
            self.initial.setdefault("host_ram", node.host_ram_bytes)
            self.initial.setdefault("labels_text", ", ".join(node.labels))
            self.initial.setdefault("allowed_env_text", ", ".join(node.allowed_env or []))
            self.initial.setdefault("gpu_count", len(specs))
            if specs:
                self.initial.setdefault("gpu_name", specs[0].name)
                self.initial.setdefault("gpu_memory", specs[0].memory_total_bytes)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if message := rules.check_node_name(name):
            raise forms.ValidationError(message)
        return name

    def clean_host(self) -> str:
        host: str = self.cleaned_data["host"].strip()
        if message := rules.check_host(host):
            raise forms.ValidationError(message)
        return host

    def clean_port(self) -> int:
        port: int = self.cleaned_data["port"]
        if message := rules.check_port(port):
            raise forms.ValidationError(message)
        return port

    def clean_ssh_user(self) -> str:
        user: str = self.cleaned_data["ssh_user"].strip()
        if message := rules.check_ssh_user(user):
            raise forms.ValidationError(message)
        return user

    def clean_run_as_user(self) -> str:
        user: str = (self.cleaned_data.get("run_as_user") or "").strip()
        if user and (message := rules.check_run_as_user(user)):
            raise forms.ValidationError(message)
        known = (self.instance.facts or {}).get("accounts") if self.instance.pk else None
        if user and isinstance(known, list) and user not in known:
            raise forms.ValidationError(
                f"{self.instance.name} has no user {user!r} (as its last discovery listed its "
                "users): create the account there, discover the node again, then name it."
            )
        return user

    def clean_allowed_env_text(self) -> list[str]:
        names, message = parse_allowances(self.cleaned_data["allowed_env_text"])
        if message:
            raise forms.ValidationError(message)
        return names

    def clean_sglang_python(self) -> str:
        path: str = self.cleaned_data["sglang_python"].strip()
        if message := rules.check_python_path(path):
            raise forms.ValidationError(message)
        return path

    def clean_gpu_name(self) -> str:
        name: str = self.cleaned_data["gpu_name"].strip()
        if not name.isprintable():
            raise forms.ValidationError("The GPU model name has control characters.")
        return name

    def clean_gpu_memory(self) -> int | None:
        # The box shows a rounded figure: sent back unchanged, the exact bytes are kept.
        size = kept_if_unchanged(self.cleaned_data["gpu_memory"], self.initial.get("gpu_memory"))
        if size is not None and (message := rules.check_gpu_memory(size)):
            raise forms.ValidationError(message)
        return size

    def clean_host_ram(self) -> int | None:
        size = kept_if_unchanged(self.cleaned_data["host_ram"], self.initial.get("host_ram"))
        if size is not None and (message := rules.check_host_ram(size)):
            raise forms.ValidationError(message)
        return size

    def clean_labels_text(self) -> list[str]:
        labels, message = rules.parse_labels(self.cleaned_data["labels_text"])
        if message:
            raise forms.ValidationError(message)
        return labels

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("gpu_count") == 0 and data.get("gpu_memory") is not None:
            self.add_error("gpu_count", "GPU memory is given, so give the GPU count too.")
        if data.get("gpu_count"):
            if not data.get("gpu_name") and "gpu_name" not in self.errors:
                self.add_error("gpu_name", "Name the GPU model (e.g. NVIDIA H200).")
            if data.get("gpu_memory") is None and "gpu_memory" not in self.errors:
                self.add_error("gpu_memory", "Give the memory of each GPU, with its unit.")
        return data

    def gpus_changed(self) -> bool:
        """Whether the GPU inputs differ from what was shown (mixed nodes keep their GPUs)."""
        if not self.instance.pk:
            return True
        return bool({"gpu_count", "gpu_name", "gpu_memory"} & set(self.changed_data))

    def gpu_specs(self) -> list[rules.GpuSpec]:
        data = self.cleaned_data
        if not data.get("gpu_count"):
            return []
        return rules.uniform_gpus(data["gpu_count"], data["gpu_name"], data["gpu_memory"])

    @transaction.atomic
    def save(self, commit: bool = True) -> Node:
        node: Node = super().save(commit=False)
        node.host_ram_bytes = self.cleaned_data.get("host_ram")
        node.labels = self.cleaned_data.get("labels_text", [])
        node.allowed_env = self.cleaned_data.get("allowed_env_text", [])
        node.save()
        wanted = self.gpu_specs()
        if self.gpus_changed() and wanted != node.gpu_specs():
            node.gpus.all().delete()
            Gpu.objects.bulk_create(
                Gpu(node=node, index=g.index, name=g.name, memory_total_bytes=g.memory_total_bytes)
                for g in wanted
            )
        return node
