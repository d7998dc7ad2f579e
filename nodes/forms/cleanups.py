"""The cleanup form: which GPUs, and which other holders may be killed, each confirmed by PID."""

from __future__ import annotations

from typing import Any, cast

from django import forms

from nodes.domain.gpu_holders import Holder


class CleanupForm(forms.Form):
    gpus = forms.TypedMultipleChoiceField(
        coerce=int,
        widget=forms.CheckboxSelectMultiple,
        label="GPUs to recover",
    )
    foreign = forms.TypedMultipleChoiceField(
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Other holders of these GPUs to kill",
        help_text="Processes that are not this launch's. Each is killed only if ticked here.",
    )
    confirm_foreign = forms.BooleanField(
        required=False,
        label="Yes, kill the processes ticked above (each named by PID and command)",
    )
    confirm = forms.BooleanField(
        label="Kill the launch's processes and recover these GPUs",
        help_text="SIGTERM, then SIGKILL; every step is recorded in the node's history.",
    )

    def __init__(
        self, *args: Any, gpu_indexes: list[int], others: list[Holder], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        gpus = cast(forms.ChoiceField, self.fields["gpus"])
        foreign = cast(forms.ChoiceField, self.fields["foreign"])
        gpus.choices = [(i, f"GPU {i}") for i in gpu_indexes]
        foreign.choices = [
            (h.pid, f"PID {h.pid} ({_owner(h)}, GPU {','.join(map(str, h.gpus))}): {h.command}")
            for h in others
        ]
        if not others:
            del self.fields["foreign"]
            del self.fields["confirm_foreign"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        named = self.data.getlist("foreign") if hasattr(self.data, "getlist") else []
        if "foreign" not in self.fields and named:
            # Nothing is offered (another team's team-only launch is never): not dropped
            # silently, refused.
            self.add_error(None, "No other holder of these GPUs may be killed from here.")
        if data.get("foreign") and not data.get("confirm_foreign"):
            self.add_error(
                "confirm_foreign", "Confirm separately that the ticked processes may be killed."
            )
        return data


def _owner(holder: Holder) -> str:
    if holder.team_only:
        return "a team-only launch's process"
    return f"launch #{holder.launch_id}'s process" if holder.launch_id else "not Rankwise's"
