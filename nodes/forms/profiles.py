"""The launch-profile form: common SGLang flags as fields, the rest as extra flags."""

from __future__ import annotations

import shlex
from decimal import Decimal
from typing import Any

from django import forms

from nodes.domain import inventory as rules
from nodes.domain.env_policy import check_name
from nodes.domain.sglang_flags import split_command
from nodes.models import Node
from nodes.services.profiles import env_problems

KV_DTYPES = [
    ("auto", "auto (model dtype)"),
    ("fp8_e4m3", "fp8_e4m3"),
    ("fp8_e5m2", "fp8_e5m2"),
    ("bf16", "bf16"),
]
WRITE_POLICIES = [
    ("", "default"),
    ("write_through", "write_through"),
    ("write_back", "write_back"),
    ("write_through_selective", "write_through_selective"),
]
IO_BACKENDS = [("", "default"), ("kernel", "kernel"), ("direct", "direct")]
MEM_LAYOUTS = [("", "default"), ("layer_first", "layer_first"), ("page_first", "page_first")]

# form field → (flag, kind); the order is the order of the generated command line.
STRUCTURED: list[tuple[str, str, str]] = [
    ("model_path", "--model-path", "value"),
    ("tp_size", "--tp-size", "int"),
    ("pp_size", "--pp-size", "int"),
    ("dp_size", "--dp-size", "int"),
    ("mem_fraction_static", "--mem-fraction-static", "value"),
    ("kv_cache_dtype", "--kv-cache-dtype", "value"),
    ("port", "--port", "int"),
    ("enable_hicache", "--enable-hierarchical-cache", "bool"),
    ("hicache_size", "--hicache-size", "int"),
    ("hicache_ratio", "--hicache-ratio", "value"),
    ("hicache_write_policy", "--hicache-write-policy", "value"),
    ("hicache_io_backend", "--hicache-io-backend", "value"),
    ("hicache_mem_layout", "--hicache-mem-layout", "value"),
]
CHOICES = {
    "kv_cache_dtype": {c for c, _ in KV_DTYPES},
    "hicache_write_policy": {c for c, _ in WRITE_POLICIES},
    "hicache_io_backend": {c for c, _ in IO_BACKENDS},
    "hicache_mem_layout": {c for c, _ in MEM_LAYOUTS},
}
DEFAULTS = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "kv_cache_dtype": "auto", "port": 30000}


class ProfileForm(forms.Form):
    """A profile, checked against a node before it can be saved."""

    name = forms.CharField(max_length=63, help_text="e.g. kimi-k2-tp8")
    node = forms.ModelChoiceField(Node.objects.all(), help_text="Checked against this node.")
    pasted_command = forms.CharField(
        label="Start from a command line",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="Paste python3 -m sglang.launch_server … and press Load.",
    )
    model_path = forms.CharField(max_length=1024)
    tp_size = forms.IntegerField(label="TP size", min_value=1, max_value=64, initial=1)
    pp_size = forms.IntegerField(label="PP size", min_value=1, max_value=64, initial=1)
    dp_size = forms.IntegerField(label="DP size", min_value=1, max_value=64, initial=1)
    mem_fraction_static = forms.DecimalField(
        label="mem-fraction-static",
        required=False,
        min_value=Decimal("0.05"),
        max_value=Decimal("0.99"),
        decimal_places=3,
        help_text="Empty: SGLang's default.",
    )
    kv_cache_dtype = forms.ChoiceField(label="KV cache dtype", choices=KV_DTYPES, initial="auto")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=30000)
    enable_hicache = forms.BooleanField(label="Hierarchical cache (host pool)", required=False)
    hicache_size = forms.IntegerField(
        label="Host pool per TP rank (GB, 10^9 bytes)",
        required=False,
        min_value=0,
        max_value=1_000_000,
        help_text="SGLang's --hicache-size is per rank: every TP rank on the node pins this much.",
    )
    hicache_ratio = forms.DecimalField(
        label="Host pool ratio (× the rank's device KV pool)",
        required=False,
        min_value=Decimal("0.1"),
        max_value=Decimal("100"),
        decimal_places=2,
    )
    hicache_write_policy = forms.ChoiceField(choices=WRITE_POLICIES, required=False)
    hicache_io_backend = forms.ChoiceField(choices=IO_BACKENDS, required=False)
    hicache_mem_layout = forms.ChoiceField(choices=MEM_LAYOUTS, required=False)
    extra_flags = forms.CharField(
        required=False,
        help_text="Other SGLang flags, as on a command line.",
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
    )
    env = forms.CharField(
        label="Environment",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One NAME=value per line.",
    )
    model_config = forms.CharField(
        label="Model config.json (if the node cannot be read)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
    )
    message = forms.CharField(label="What changed", required=False, max_length=500)
    acknowledge = forms.BooleanField(label="I have read the warnings", required=False)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if message := rules.check_node_name(name):
            raise forms.ValidationError(message)
        return name

    def clean_extra_flags(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["extra_flags"])
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split these flags: {exc}") from None

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in self.cleaned_data["env"].splitlines():
            if not line.strip():
                continue
            key, sep, value = line.strip().partition("=")
            if not sep:
                raise forms.ValidationError(f"{line.strip()[:40]!r} is not NAME=value")
            if problem := check_name(key):
                raise forms.ValidationError(problem)
            env[key] = value
        return env

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # The environment policy on the chosen node (its admin allowances count).
        if data.get("node") is not None and data.get("env"):
            for problem in env_problems(data["env"], data["node"]):
                self.add_error("env", problem)
        return data

    def args(self) -> list[str]:
        """The flags after ``python3 -m sglang.launch_server``, in a stable order."""
        data = self.cleaned_data
        argv: list[str] = []
        for field, flag, kind in STRUCTURED:
            value = data.get(field)
            if kind == "bool":
                if value:
                    argv.append(flag)
            elif value not in (None, "") and DEFAULTS.get(field) != value:
                argv += [flag, str(value)]
        return argv + list(data.get("extra_flags") or [])


def data_from_command(command: str, base: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Form data for a pasted launch command: structured fields filled, the rest as extra flags.

    Returns ``(data, error)``; on an unsplittable command the error says why.
    """
    try:
        argv, env = split_command(command)
    except ValueError as exc:
        return base, f"The command cannot be split: {exc}"
    flags = {flag: field for field, flag, _ in STRUCTURED}
    aliases = {
        "--tp": "--tp-size",
        "--tensor-parallel-size": "--tp-size",
        "--model": "--model-path",
        "--pp": "--pp-size",
        "--dp": "--dp-size",
        "--enable-hicache": "--enable-hierarchical-cache",
    }
    data = {k: v for k, v in base.items() if k not in {f for f, _, _ in STRUCTURED}}
    data.update({k: str(v) for k, v in DEFAULTS.items()})
    extra: list[str] = []
    words = list(argv)
    while words:
        word = words.pop(0)
        flag, sep, inline = word.partition("=")
        flag = aliases.get(flag, flag)
        field = flags.get(flag)
        kind = next((k for f, fl, k in STRUCTURED if fl == flag), None)
        if field is None:
            extra.append(word)
        elif kind == "bool":
            data[field] = "on"
        else:
            value = inline if sep else (words.pop(0) if words else "")
            allowed = CHOICES.get(field)
            if allowed is not None and value not in allowed:
                extra += [flag, value]  # not offered by the form: keep it as typed
            else:
                data[field] = value
    data["extra_flags"] = shlex.join(extra)
    data["env"] = "\n".join(f"{k}={v}" for k, v in env.items())
    data["pasted_command"] = ""
    return data, None
