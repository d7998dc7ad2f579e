"""Launch-profile pages: list, detail, and the form that checks the budget as you type."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Exists, F, Max, OuterRef, Prefetch, Subquery
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nodes.domain import planner, remedy, revision_diff
from nodes.domain.inventory import check_node_name
from nodes.domain.redact import redact_args, redact_env
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.forms.profiles import ProfileForm, data_from_command
from nodes.models import KnownGoodStamp, LaunchProfile, Node, ProfileRevision, Team
from nodes.models.choices import Role
from nodes.services import placement, teams
from nodes.services import planner as plans
from nodes.services.audit import record
from nodes.services.model_facts import model_facts, model_of
from nodes.services.profiles import (
    EnvRefused,
    ProfileRefused,
    PromoteRefused,
    evaluate,
    node_as_inventoried,
    promote,
    save_revision,
    seen_profile,
    submit_revision,
)
from nodes.services.roles import has_role
from nodes.services.teams import visible_profiles
from nodes.views import calibrations as calibration_views
from nodes.views.http import HtmxHttpRequest, after_post, role_required

#: Polls of a model reading the budget panel makes (0.4 s apart) before it says none came.
MODEL_POLLS = 150

# What the form says when the save is refused, by ``ProfileRefused.kind`` (else its reason).
SAVE_REFUSALS = {
    "block": (None, "Blocked: this node cannot run this profile (see the budget)."),
    "warn": ("acknowledge", "Read the warnings, then tick this box to save."),
    "exists": ("name", "A profile with this name exists; edit it to add a revision."),
}


@require_GET
@login_required
def profile_list(request: HtmxHttpRequest) -> HttpResponse:
    # Ad-hoc profiles (one pasted command each) live on their launch pages, not in this list.
    profiles = (
        visible_profiles(request.user)
        .filter(adhoc=False)
        .prefetch_related(
            "revisions",
            Prefetch("revisions__stamps", KnownGoodStamp.objects.order_by("-stamped_at")),
        )
    )
    wanted = request.GET.get("node", "")
    node = Node.objects.filter(name=wanted).first() if wanted and "\x00" not in wanted else None
    gpu_class = request.GET.get("gpu_class", "")
    if wanted and node is None:
        gpu_class = "no such node"  # matches no stamp: the list says none is known-good there
    # Known-good here means earned here: an imported stamp filters and orders nothing.
    stamps = KnownGoodStamp.objects.filter(revision__profile=OuterRef("pk"), imported_at=None)
    if node is not None:
        stamps = stamps.filter(node=node)
    if gpu_class:
        stamps = stamps.filter(**_gpu_class_filter(gpu_class))
    if wanted or gpu_class:
        profiles = profiles.filter(Exists(stamps))
    # Recent success first: the newest stamp (there, when filtered), then the rest by name.
    profiles = profiles.annotate(
        last_success=Subquery(stamps.order_by("-stamped_at").values("stamped_at")[:1])
    ).order_by(F("last_success").desc(nulls_last=True), "name")
    adhoc = (
        visible_profiles(request.user)
        .filter(adhoc=True)
        .annotate(revision_count=Count("revisions"), last_saved=Max("revisions__created"))
        .order_by("-last_saved")
    )
    context = {
        "profiles": profiles,
        "adhoc": adhoc[:50],
        "adhoc_count": adhoc.count(),
        "nodes": Node.objects.values_list("name", flat=True),
        "gpu_classes": sorted(
            {s.gpu_class for s in KnownGoodStamp.objects.filter(imported_at=None)}
        ),
        "node": wanted,
        "gpu_class": request.GET.get("gpu_class", ""),
        "filtered": bool(wanted or gpu_class),
    }
    return render(request, "nodes/profile_list.html", context)


def _gpu_class_filter(text: str) -> dict[str, Any]:
    """``8 × NVIDIA H200 (96 GiB)`` → the stamp fields it stands for (nothing matches junk)."""
    match = re.fullmatch(r"([0-9]{1,4}) × ([^\x00]{1,128}) \(([0-9]{1,7}) GiB\)", text)
    if not match:
        return {"pk__in": []}
    count, name, gib = int(match[1]), match[2], int(match[3])
    return {
        "gpu_count": count,
        "gpu_name": name,
        "gpu_memory_bytes__gte": round((gib - 0.5) * 2**30),
        "gpu_memory_bytes__lt": round((gib + 0.5) * 2**30),
    }


@require_GET
@login_required
def profile_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    revisions = profile.revisions.select_related("node").prefetch_related("stamps", "launches")
    context = {
        "profile": profile,
        "revisions": revisions,
        "teams": Team.objects.all(),
        "calibrations": calibration_views.rows(profile),
    }
    return render(request, "nodes/profile_detail.html", context)


@require_POST
@role_required(Role.OPERATOR)
def profile_ownership(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Which team owns the profile, and whether everyone or only that team sees it."""
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    team_id = request.POST.get("team", "")
    team = (
        Team.objects.filter(pk=int(team_id)).first()
        if re.fullmatch(r"[0-9]{1,9}", team_id)
        else None
    )
    visibility = request.POST.get("visibility", "")
    if visibility not in LaunchProfile.Visibility.values or (team_id and team is None):
        messages.error(request, "Choose a team (or none) and who may see the profile.")
        return after_post(request, reverse("nodes:profile-detail", args=[profile.pk]))
    if not has_role(request.user, Role.ADMIN) and any(
        t is not None and not t.members.filter(pk=request.user.pk or 0).exists()
        for t in (profile.team, team)
    ):
        messages.error(request, "Only members of the teams involved (or an admin) may do that.")
        return after_post(request, reverse("nodes:profile-detail", args=[profile.pk]))
    if visibility == LaunchProfile.Visibility.TEAM and team is None:
        messages.error(request, "Only a profile owned by a team can be visible to its team only.")
        return after_post(request, reverse("nodes:profile-detail", args=[profile.pk]))
    before = {"team": profile.team.name if profile.team else None, "visibility": profile.visibility}
    profile.team, profile.visibility = team, visibility
    profile.save(update_fields=["team", "visibility"])
    record(
        "profile.ownership",
        actor=request.user,
        obj=profile,
        before=before,
        after={"team": team.name if team else None, "visibility": visibility},
        request=request,
    )
    messages.success(request, f"{profile.name}: owned by {team or 'no team'}, visible to "
                     f"{profile.get_visibility_display().lower()}.")  # fmt: skip
    return after_post(request, reverse("nodes:profile-detail", args=[profile.pk]))


def _checked(
    form: ProfileForm,
    user: Any,
    *,
    read_node: bool = True,
    wait: float = 0,
    profile_name: str | None = None,
    workload: planner.Workload | None = None,
) -> dict[str, Any]:
    """The budget panel's context for a bound, valid form: the budget on the node as it would
    be for this revision's own launch (what saving checks), and apart from it whether it could
    start there now beside what runs (``now``: a placement ``Candidate`` or ``Refused``, as
    ``user`` may read it); with a ``workload``, the planner's settings for it (``plans``).
    With ``read_node`` false nothing runs on the node (the model is read from a pasted
    config.json only)."""
    node = form.cleaned_data["node"]
    data = form.cleaned_data
    model = model_facts(
        node, data["model_path"], data["model_config"], read_node=read_node, wait=wait
    )
    env = form.cleaned_data["env"]
    # As for this profile's own launch: its running servers' memory is not someone else's.
    name = seen_profile(user, profile_name or data.get("name") or None)
    # The revision is judged against the node as inventoried; "could it start now" (``now``)
    # is the separate answer against what runs there.
    memory = node_as_inventoried(node)
    report = evaluate(form.args(), node, model, env=env, memory=memory, profile=name)
    shown = [f"{k}={v}" for k, v in sorted(redact_env(env).items())]
    command = shlex.join(
        [*shown, "python3", "-m", "sglang.launch_server", *redact_args(form.args())]
    )
    now = placement.on_node(node, form.args(), env, model)
    now = replace(now, reasons=teams.mask_launch_ids(user, now.reasons))
    # Without it the server exports no gauges: no load plots, no bottleneck (issue 20).
    metrics = parse_command(form.args(), table(node.sglang_version or DEFAULT_VERSION))
    return {
        "report": report,
        "model": model,
        "node": node,
        "command": command,
        "now": now,
        "suggest_metrics": not metrics.get("enable_metrics", default=False),
        "plans": (
            None
            if workload is None
            else plans.plan_for(node, form.args(), env, model, memory, workload)
        ),
    }


#: The planner's inputs on the budget panel (sent with the form; never saved).
WORKLOAD_FIELDS = ("plan_input_tokens", "plan_output_tokens", "plan_concurrency")


def _workload(post: Any) -> tuple[planner.Workload | None, str]:
    """The workload the planner's inputs hold, or ``None`` and why (blank when they are)."""
    texts = [str(post.get(name, "")).strip().replace(",", "") for name in WORKLOAD_FIELDS]
    if not any(texts):
        return None, ""
    if not all(re.fullmatch(r"[0-9]{1,9}", t) for t in texts):
        return None, "Give all three as whole numbers: tokens in, tokens out, requests at once."
    try:
        return planner.Workload(*(int(t) for t in texts)), ""
    except ValueError as exc:
        return None, f"The workload: {exc}."


def _workload_context(post: Any) -> dict[str, Any]:
    workload, error = _workload(post)
    values = {name: str(post.get(name, ""))[:12] for name in WORKLOAD_FIELDS}
    return {"workload": workload, "workload_error": error, "workload_values": values}


def _with_suggestion(
    request: HtmxHttpRequest,
    form: ProfileForm,
    data: dict[str, Any],
    alternative: str | None = None,
) -> ProfileForm:
    """The form with the budget's suggested change applied to its flags (the change the panel
    offers, computed again now), or its ``alternative`` (the index of ``report.alternatives``,
    as text), or as it was with a message where there is none."""
    if not form.is_valid():
        return form
    node = form.cleaned_data["node"]
    # The reading the panel showed (pages never wait on a node), and the node as this
    # profile's own launch would find it, as the panel checked it.
    model = model_facts(
        node, form.cleaned_data["model_path"], form.cleaned_data["model_config"], wait=0
    )
    name = seen_profile(request.user, form.cleaned_data.get("name") or None)
    memory = node_as_inventoried(node)
    env = form.cleaned_data["env"]
    report = evaluate(form.args(), node, model, env=env, memory=memory, profile=name)
    if alternative is not None:
        # Only a small index is one: "²" is a digit to isdigit(), and 5,000 digits overflow int().
        index = int(alternative) if re.fullmatch(r"[0-9]{1,3}", alternative) else -1
        index = index if index >= 0 else len(report.alternatives)
        if index >= len(report.alternatives):
            messages.info(request, "The budget offers no such alternative for these flags now.")
            return form
        change = report.alternatives[index]["change"]
        return _applied(request, form, data, change, "the alternative")
    if not report.suggestion:
        messages.info(request, "The budget suggests no change for these flags now.")
        return form
    return _applied(request, form, data, report.suggestion, "the suggested change")


def _applied(
    request: HtmxHttpRequest,
    form: ProfileForm,
    data: dict[str, Any],
    change: dict[str, Any],
    what: str,
) -> ProfileForm:
    """The form with ``change`` applied to its flags (nothing saved), or as it was with a
    message where the change does not apply."""
    node = form.cleaned_data["node"]
    try:
        args = remedy.with_changes(
            form.args(), change, table(node.sglang_version or DEFAULT_VERSION)
        )
    except ValueError as exc:
        messages.error(request, f"{what.capitalize()} cannot be applied: {exc}")
        return form
    command = shlex.join(["python3", "-m", "sglang.launch_server", *args])
    loaded, _ = data_from_command(command, data)
    loaded["env"] = data.get("env", "")
    messages.info(
        request,
        f"Applied {what}: {remedy.describe(change)}. Nothing is saved until you save the revision.",
    )
    return ProfileForm(loaded)


def _with_plan(request: HtmxHttpRequest, form: ProfileForm, data: dict[str, Any]) -> ProfileForm:
    """The form with the planner's chosen setting applied, if the planner offers it now."""
    workload, error = _workload(request.POST)
    text = request.POST.get("plan_change", "")
    try:
        # An offered change is a few flags: a longer text is no offer (and no deep nesting).
        change = json.loads(text) if len(text) <= 1000 else None
    except ValueError:
        change = None
    if not form.is_valid() or workload is None or not isinstance(change, dict):
        messages.error(request, error or "No planned setting to apply; plan again.")
        return form
    node = form.cleaned_data["node"]
    model = model_facts(
        node, form.cleaned_data["model_path"], form.cleaned_data["model_config"], wait=0
    )
    memory = node_as_inventoried(node)
    offered = plans.plan_for(node, form.args(), form.cleaned_data["env"], model, memory, workload)
    if change not in [p.change for p in offered]:
        messages.error(request, "The planner does not offer that setting now; plan again.")
        return form
    return _applied(request, form, data, change, "the planned setting")


def _name_fixed(form: ProfileForm) -> None:
    """A new revision keeps its profile's name: shown read-only, but sent with the form, so
    the live check knows whose revision it checks (a save takes the profile's name anyway)."""
    form.fields["name"].widget.attrs["readonly"] = True


@require_POST
@login_required
def profile_check(request: HtmxHttpRequest) -> HttpResponse:
    """The live budget panel for what the form holds now; it never touches the inputs. Only
    an operator's check reads the model on the node: a viewer gets the budget without it."""
    data = request.POST.copy()
    name = str(data.get("name", "")).strip()
    if not name or check_node_name(name):
        # The budget needs no name (a save does): a form not named yet is checked all the same.
        data["name"], name = "unnamed", ""
    form = ProfileForm(data)
    text = request.POST.get("polls", "")
    polls = int(text) if re.fullmatch(r"[0-9]{1,4}", text) else 0
    context: dict[str, Any] = {"form": form, "polls": polls + 1, **_workload_context(data)}
    if form.is_valid():
        operator = has_role(request.user, Role.OPERATOR)
        context.update(
            _checked(
                form,
                request.user,
                read_node=operator,
                profile_name=name,
                workload=context["workload"],
            )
        )
        # The panel asks again while the model is being read, for about a minute at most.
        context["stalled"] = context["model"].pending and polls >= MODEL_POLLS
    return render(request, "nodes/profile_form.html#budget-panel", context)


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def profile_create(request: HtmxHttpRequest) -> HttpResponseBase:
    return _profile_form(request, None)


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def profile_edit(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    return _profile_form(request, get_object_or_404(visible_profiles(request.user), pk=pk))


def _initial(profile: LaunchProfile | None) -> dict[str, Any]:
    latest = profile.latest() if profile else None
    if latest is None:
        return {"name": profile.name if profile else ""}
    env = "".join(shlex.quote(f"{k}={v}") + " " for k, v in sorted(latest.env.items()))
    data, _ = data_from_command(
        f"{env}python3 -m sglang.launch_server {shlex.join(latest.args)}",
        {"name": profile.name if profile else ""},
    )
    data["node"] = latest.node_id
    return data


@require_GET
@role_required(Role.OPERATOR)
def profile_clone(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Clone a revision to another node: its flags re-validated against the target, and what
    must change there (the budget engine's suggestion, e.g. the largest --hicache-size that
    fits) offered as an edit before anything is saved."""
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    revision = _revision_of(profile, request.GET.get("revision"))
    target = _node_of(request.GET.get("node"))
    context: dict[str, Any] = {
        "profile": profile,
        "revision": revision,
        "nodes": Node.objects.exclude(pk=revision.node_id or 0) if revision else Node.objects.all(),
        "target": target,
    }
    if revision is not None and target is not None:
        context.update(clone_to(revision, target))
    return render(request, "nodes/profile_clone.html", context)


@require_GET
@login_required
def profile_diff(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Two revisions side by side: the flags added, removed and changed from ``a`` to ``b``,
    and each one's budget verdict when it was saved."""
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    numbers = list(profile.revisions.order_by("number").values_list("number", flat=True))
    a = _revision_of(profile, request.GET.get("a") or str(numbers[-2] if len(numbers) > 1 else 0))
    b = _revision_of(profile, request.GET.get("b"))
    context: dict[str, Any] = {"profile": profile, "numbers": numbers, "a": a, "b": b}
    if a is not None and b is not None:
        version = table(b.sglang_version or DEFAULT_VERSION)
        context["changes"] = revision_diff.diff(a.args, b.args, version, a.env, b.env)
    return render(request, "nodes/profile_diff.html", context)


@require_POST
@role_required(Role.OPERATOR)
def profile_revert(request: HtmxHttpRequest, pk: int, number: int) -> HttpResponseBase:
    """A new revision equal to revision ``number`` (flags and environment), checked again on
    its node before it is saved."""
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    old = get_object_or_404(ProfileRevision, profile=profile, number=number)
    latest = profile.latest()
    node = old.node or (latest.node if latest is not None else None)
    if node is None:
        messages.error(request, f"{old} names no node to check it on; edit it instead.")
        return after_post(request, reverse("nodes:profile-detail", args=[profile.pk]))
    model = model_of(node, list(old.args), wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS)
    memory = node_as_inventoried(node)
    env = dict(old.env or {})
    report = evaluate(list(old.args), node, model, env=env, memory=memory, profile=profile.name)
    try:
        revision = save_revision(
            profile_name=profile.name,
            args=list(old.args),
            env=dict(old.env or {}),
            message=f"Revert to @{old.number}",
            node=node,
            report=report,
            model=model,
            actor=request.user,
            request=request,
        )
    except ValueError as exc:
        blocks = "; ".join(m.text for m in report.messages if m.level == "block")
        why = exc if isinstance(exc, EnvRefused) else blocks  # the environment policy's refusal
        messages.error(request, f"@{old.number} is blocked on {node.name} now: {why}")
    else:
        messages.success(request, f"Saved {revision}: equal to @{old.number} ({report.verdict}).")
    return after_post(request, reverse("nodes:profile-detail", args=[profile.pk]))


def clone_to(revision: ProfileRevision, target: Node) -> dict[str, Any]:
    """The revision's flags checked on ``target``; the budget's suggested changes applied and
    checked again."""
    version = table(target.sglang_version or DEFAULT_VERSION)
    flags = parse_command(list(revision.args), version)
    model = model_of(target, list(revision.args))
    env = dict(revision.env or {})
    as_is = evaluate(list(revision.args), target, model, env=env)
    changes = dict(as_is.suggestion or {})
    proposed_args = list(revision.args)
    if changes:
        try:
            proposed_args = remedy.with_changes(proposed_args, changes, version)
        except ValueError:
            changes = {}
    proposed = evaluate(proposed_args, target, model, env=env) if changes else as_is
    rows = []
    for option, value in changes.items():
        before = flags.get(option.lstrip("-").replace("-", "_"))
        rows.append((option, before, value))
    query = urlencode(
        {"clone": revision.pk, "node": target.pk, **({"apply": "1"} if changes else {})}
    )
    return {
        "as_is": as_is,
        "proposed": proposed,
        "changes": rows,
        "proposed_args": proposed_args,
        "shown_command": shlex.join(
            ["python3", "-m", "sglang.launch_server", *redact_args(proposed_args)]
        ),
        "edit_url": f"{reverse('nodes:profile-create')}?{query}",
    }


def _revision_of(profile: LaunchProfile, number: str | None) -> ProfileRevision | None:
    if number and re.fullmatch(r"[0-9]{1,9}", number):
        return profile.revisions.filter(number=int(number)).first()
    return profile.latest()


def _node_of(pk: str | None) -> Node | None:
    return (
        Node.objects.filter(pk=int(pk)).first() if pk and re.fullmatch(r"[0-9]{1,9}", pk) else None
    )


def _clone_initial(request: HtmxHttpRequest) -> tuple[dict[str, Any], str] | None:
    """The form's start when it comes from "Clone to another node": the source revision's
    flags with the target's suggested changes applied (``apply=1``), a new name."""
    source = (
        ProfileRevision.objects.select_related("profile")
        .filter(
            profile__in=visible_profiles(request.user),
            pk=int(request.GET["clone"])
            if re.fullmatch(r"[0-9]{1,9}", request.GET.get("clone", ""))
            else -1,
        )
        .first()
    )
    target = _node_of(request.GET.get("node"))
    if source is None or target is None:
        return None
    args = list(source.args)
    note = f"Cloned from {source} to {target.name}."
    if request.GET.get("apply") == "1":
        found = clone_to(source, target)
        args = found["proposed_args"]
        if found["changes"]:
            shown = ", ".join(f"{o} {v}" for o, _, v in found["changes"])
            note += f" Proposed for {target.name}: {shown}."
    env = "".join(shlex.quote(f"{k}={v}") + " " for k, v in sorted(source.env.items()))
    data, _ = data_from_command(
        f"{env}python3 -m sglang.launch_server {shlex.join(args)}",
        {"name": f"{source.profile.name}-{target.name}"[:63], "message": note},
    )
    data["node"] = target.pk
    return data, note


def _profile_form(request: HtmxHttpRequest, profile: LaunchProfile | None) -> HttpResponseBase:
    context: dict[str, Any] = {"profile": profile}
    if request.method == "GET" and profile is None and request.GET.get("clone"):
        cloned = _clone_initial(request)
        if cloned is not None:
            data, context["clone_note"] = cloned
            form = ProfileForm({k: v for k, v in data.items() if v not in (None, "")})
            if form.is_valid():
                context.update(_checked(form, request.user))
            return render(
                request, "nodes/profile_form.html", {**context, "form": ProfileForm(initial=data)}
            )
    if request.method == "GET":
        initial = _initial(profile)
        if profile is not None and initial.get("node"):
            # A new revision starts from the last one, checked already.
            form = ProfileForm({k: v for k, v in initial.items() if v not in (None, "")})
            if form.is_valid():
                context.update(_checked(form, request.user))
            form = ProfileForm(initial=initial)
        else:
            form = ProfileForm(initial=initial)
        if profile is not None:
            _name_fixed(form)
        return render(request, "nodes/profile_form.html", {**context, "form": form})
    data = request.POST.copy()
    if profile is not None:
        data["name"] = profile.name
    if request.POST.get("action") == "load" and not request.POST.get("pasted_command", "").strip():
        # Enter in any box submits the form's first button: with nothing pasted, keep the fields.
        form = ProfileForm(data)
        messages.info(request, "Nothing pasted to load: the fields are as they were.")
    elif request.POST.get("action") == "load":
        loaded, error = data_from_command(request.POST.get("pasted_command", ""), data.dict())
        if error:
            # Only the paste is in question: the fields stay as they were, not yet checked
            # (an empty name is not "required" before a save).
            form = ProfileForm(initial=loaded)
            form.cleaned_data = {}  # an unbound form keeps an error only with this set
            form.add_error("pasted_command", error)
        else:
            form = ProfileForm(loaded)
    elif request.POST.get("action") == "apply":
        form = _with_suggestion(request, ProfileForm(data), data.dict())
    elif str(request.POST.get("action", "")).startswith("apply-alternative-"):
        form = _with_suggestion(
            request, ProfileForm(data), data.dict(), alternative=request.POST["action"][18:]
        )
    elif request.POST.get("plan_change"):
        form = _with_plan(request, ProfileForm(data), data.dict())
    else:
        form = ProfileForm(data)
    if profile is not None:
        _name_fixed(form)
        form.initial["name"] = profile.name
    planning = _workload_context(request.POST)
    context.update(planning)
    if form.is_valid():
        saving = request.POST.get("action") == "save"
        context.update(
            _checked(
                form,
                request.user,
                wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS if saving else 0,
                workload=planning["workload"],
            )
        )
        if saving and form.cleaned_data["pasted_command"].strip():
            # What is saved is what the fields show: a pasted command is never dropped silently.
            form.add_error(
                "pasted_command",
                "Load the pasted command first (Load pasted command), or clear it; nothing "
                "was saved.",
            )
        elif request.POST.get("action") == "save":
            try:
                revision, _, _ = submit_revision(
                    profile_name=form.cleaned_data["name"],
                    node=form.cleaned_data["node"],
                    args=form.args(),
                    env=form.cleaned_data["env"],
                    message=form.cleaned_data["message"],
                    actor=request.user,
                    acknowledged=form.cleaned_data["acknowledge"],
                    new_profile=profile is None,
                    pasted_config=form.cleaned_data["model_config"],
                    request=request,
                    model_wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
                )
            except ProfileRefused as refused:
                field, text = SAVE_REFUSALS.get(refused.kind, (None, refused.reason))
                form.add_error(field, text)
            else:
                messages.success(request, f"Saved {revision}.")
                return after_post(
                    request, reverse("nodes:profile-detail", args=[revision.profile_id])
                )
    return render(request, "nodes/profile_form.html", {**context, "form": form})


@require_POST
@role_required(Role.OPERATOR)
def profile_promote(request: HtmxHttpRequest, pk: int, number: int) -> HttpResponseBase:
    """Save revision ``number`` of an ad-hoc command (a fix applied to it, say) as revision 1
    of a new named profile, re-validated on its node; then open the new profile."""
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    revision = get_object_or_404(ProfileRevision, profile=profile, number=number)
    back = reverse("nodes:profile-detail", args=[profile.pk])
    if not profile.adhoc:
        messages.info(request, f"{profile.name} is a named profile already.")
        return after_post(request, back)
    try:
        saved = promote(
            revision,
            str(request.POST.get("name", ""))[:200],
            actor=request.user,
            request=request,
            wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
        )
    except PromoteRefused as exc:
        messages.error(request, f"Not saved: {exc}.")
        return after_post(request, back)
    messages.success(request, f"Saved {saved} from {revision}.")
    return after_post(request, reverse("nodes:profile-detail", args=[saved.profile_id]))
