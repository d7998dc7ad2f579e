"""The launch form: a profile revision (or a pasted command), a node, its GPUs, overrides."""

from __future__ import annotations

from typing import Any, cast

from django import forms

from nodes.domain.launch_plan import CHECK_NAMES, NOT_OVERRIDABLE, PlanError, parse_gpu_list
from nodes.models import Node, ProfileRevision
from nodes.services import inventory
from nodes.services.teams import visible_profiles

OVERRIDABLE = [(n, n) for n in CHECK_NAMES if n not in NOT_OVERRIDABLE]


class RevisionChoice(forms.ModelChoiceField):  # type: ignore[type-arg]
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj} ({obj.verdict})"


class LaunchForm(forms.Form):
    revision = RevisionChoice(
        ProfileRevision.objects.filter(profile__adhoc=False).select_related("profile"),
        required=False,
        label="Profile revision",
    )
    command = forms.CharField(
        required=False,
        label="…or a command line",
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="Pasted as run, e.g. HF_TOKEN=… python3 -m sglang.launch_server --model-path …"
        " It is stored as an ad-hoc revision.",
    )
    # A blocked ad-hoc launch is relaunched with its own revision (the real values of its
    # secrets stay in the database, never in the page).
    adhoc_revision = forms.ModelChoiceField(
        ProfileRevision.objects.filter(profile__adhoc=True),
        required=False,
        widget=forms.HiddenInput,
    )
    node = forms.ModelChoiceField(Node.objects.all())
    other_nodes = forms.CharField(
        required=False,
        max_length=1000,
        label="Other nodes (multi-node)",
        help_text="For a command with --nnodes N: the other N − 1 nodes' names in rank order, "
        "e.g. b,c (the node above is node 0). The same GPUs are taken on every node.",
    )
    gpus = forms.CharField(
        required=False,
        label="GPUs",
        help_text="Indexes, e.g. 0,1,2,3. Empty: the first free GPUs, as many as the ranks need.",
    )
    port = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=65535,
        help_text="Empty: the profile's --port (30000 by default).",
    )
    override = forms.MultipleChoiceField(
        choices=OVERRIDABLE,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Launch despite failed checks",
    )
    reason = forms.CharField(
        required=False, max_length=500, help_text="Why the failed checks may be ignored (audited)."
    )
    timeout = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=7 * 24 * 3600,
        label="Start-up timeout (s)",
        help_text="Empty: the panel's default.",
    )

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        as_root = [n.name for n in Node.objects.order_by("name") if n.server_user == "root"]
        if as_root:
            # Said before anything runs: a model's own code (--trust-remote-code) or a
            # request's would have every right on these nodes.
            self.fields["node"].help_text = (
                f"Servers run as root on {', '.join(as_root[:10])}"
                f"{' and others' if len(as_root) > 10 else ''}: no unprivileged user is named "
                "for them (an admin sets it: node page → Edit → Run servers as)."
            )
        if user is not None:
            # A team-only profile is offered to its team only.
            field = cast(forms.ModelChoiceField, self.fields["revision"])  # type: ignore[type-arg]
            field.queryset = ProfileRevision.objects.filter(
                profile__adhoc=False, profile__in=visible_profiles(user)
            ).select_related("profile")
            adhoc = cast(forms.ModelChoiceField, self.fields["adhoc_revision"])  # type: ignore[type-arg]
            adhoc.queryset = ProfileRevision.objects.filter(
                profile__adhoc=True, profile__in=visible_profiles(user)
            )

    def clean_other_nodes(self) -> list[Node]:
        names = [n.strip() for n in self.cleaned_data["other_nodes"].split(",") if n.strip()]
        try:
            return inventory.nodes_named(names)
        except inventory.UnknownNode as exc:
            raise forms.ValidationError(f"No node named {exc.args[0][:63]!r}.") from None

    def clean_gpus(self) -> list[int] | None:
        text = self.cleaned_data["gpus"].strip()
        if not text:
            return None
        try:
            return parse_gpu_list(text)
        except PlanError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "command" in self.errors:
            return data
        if data.get("adhoc_revision") and not data.get("revision"):
            data["revision"] = data["adhoc_revision"]
        has_command = bool((data.get("command") or "").strip())
        if data.get("revision") and has_command:
            raise forms.ValidationError("Choose a profile revision or paste a command, not both.")
        if not data.get("revision") and not has_command and "revision" not in self.errors:
            raise forms.ValidationError("Choose a profile revision or paste a command.")
        if data.get("override") and not (data.get("reason") or "").strip():
            self.add_error("reason", "Say why the failed checks may be ignored.")
        return data

    def overrides(self) -> dict[str, str]:
        reason = (self.cleaned_data.get("reason") or "").strip()
        return {name: reason for name in self.cleaned_data.get("override") or []}


class BundleUploadForm(forms.Form):
    """A failure bundle from any server: a ``.tar.gz`` of a ``rankwise-case/1`` folder."""

    MAX_BYTES = 64 * 2**20

    bundle = forms.FileField(
        help_text="A .tar.gz holding launch.log and facts.json (format rankwise-case/1), as "
        "'Download bundle' gives. At most 64 MiB.",
    )

    def clean_bundle(self) -> Any:
        upload = self.cleaned_data["bundle"]
        if upload.size > self.MAX_BYTES:
            raise forms.ValidationError(
                f"The bundle is {upload.size / 2**20:.0f} MiB; at most 64 MiB is read."
            )
        return upload
