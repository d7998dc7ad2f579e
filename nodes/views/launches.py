"""Launch pages: the form, the launch page (phase bar, checks, memory, capacity, the log
viewer's first window), stop, promote, fixes, bundles, test requests. The log's own reads and
its live stream are in ``views.launch_log``."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nodes.domain import endpoints, remedy, timeline
from nodes.domain.log_lines import DECODE_BATCH
from nodes.domain.logparse import PHASES, Progress, phase_label
from nodes.domain.redact import redact_args
from nodes.forms.launches import BundleUploadForm, LaunchForm
from nodes.models import BundleUpload, Launch, Node, ProfileRevision
from nodes.models.choices import LAUNCH_ENDED, LaunchStatus, Role
from nodes.queue import QueueUnavailable, send
from nodes.services import (
    bundle_uploads,
    bundles,
    capacity,
    fixes,
    launch_flags,
    log_view,
    placement,
    profiles,
    reservations,
    test_requests,
)
from nodes.services.teams import visible_launches, visible_profiles
from nodes.views.http import HtmxHttpRequest, after_post, role_required, task_state
from nodes.workflows import launching

#: Lines the launch page opens with (the viewer reads more as you scroll).
LINES_SHOWN = 1000


@require_GET
@login_required
def launch_list(request: HtmxHttpRequest) -> HttpResponse:
    seen = visible_launches(request.user)
    rows = seen.select_related("node", "revision__profile")
    status = request.GET.get("status", "")
    node = _filter_value(request.GET.get("node", ""))
    category = request.GET.get("category", "")
    if not re.fullmatch(r"[a-z][a-z-]{0,39}", category):
        category = ""
    if status in LaunchStatus.values:
        rows = rows.filter(status=status)
    if node:
        rows = rows.filter(node__name=node)
    if category:
        rows = rows.filter(diagnosis_category=category)
    page = Paginator(rows, 50).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "statuses": LaunchStatus.choices,
        "nodes": Node.objects.values_list("name", flat=True),
        "categories": seen.exclude(diagnosis_category="")
        .order_by("diagnosis_category")
        .values_list("diagnosis_category", flat=True)
        .distinct(),
        "status": status,
        "node": node,
        "category": category,
        "query": urlencode({k: v for k, v in request.GET.items() if k != "page"}),
    }
    return render(request, "nodes/launch_list.html", context)


def _seen(request: HttpRequest) -> QuerySet[Launch]:
    """The launches the caller may see: another team's own are 404 on every launch URL."""
    return visible_launches(request.user)


def _filter_value(text: str) -> str:
    """A filter value the database can compare (PostgreSQL refuses NUL in text), else none."""
    return text if "\x00" not in text and len(text) <= 200 else ""


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def launch_create(request: HtmxHttpRequest) -> HttpResponseBase:
    if request.method == "POST":
        form = LaunchForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                launch = launching.submit(
                    node=data["node"],
                    revision=data["revision"],
                    command=data["command"] or None,
                    gpus=data["gpus"],
                    overrides=form.overrides(),
                    timeout_s=data["timeout"],
                    port=data["port"],
                    actor=request.user,
                    request=request,
                    model_wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
                    nodes=[data["node"], *data["other_nodes"]] if data["other_nodes"] else (),
                )
            except launching.LaunchInputError as exc:
                form.add_error(None, str(exc))
            else:
                return after_post(request, reverse("nodes:launch-detail", args=[launch.pk]))
    else:
        initial: dict[str, Any] = {}
        for key in ("node", "gpus", "port", "command"):
            if request.GET.get(key):
                initial[key] = request.GET[key]
        # ``?profile=NAME&revision=N`` names @N as the operator reads it, not a database id.
        named = _revision_named(
            request.GET.get("profile"), request.GET.get("revision"), request.user
        )
        if named is not None:
            initial["adhoc_revision" if named.profile.adhoc else "revision"] = named.pk
        asked = _node_named_by(initial)
        placed = _placed(initial, request.user)
        form = LaunchForm(initial=initial, user=request.user)
        context = {
            "form": form,
            "preset": _preset(form, request.user),
            "placed": placed,
            "chosen": _chosen_node(asked, placed),
        }
        return render(request, "nodes/launch_form.html", context)
    context = {"form": form, "preset": _preset(form, request.user)}
    return render(request, "nodes/launch_form.html", context)


def _placed(initial: dict[str, Any], user: Any) -> placement.Placement | None:
    """Where the revision the form opens with fits now. The node the link chose (the
    revision's own, on its profile page) stays chosen where it fits, with its first free GPU
    set; elsewhere the best node and GPUs are preselected (in ``initial``)."""
    pk = initial.get("adhoc_revision") or initial.get("revision")
    revision = _visible_revision(pk, user)
    if revision is None:
        return None
    found = placement.place(revision, user)
    chosen = _node_named_by(initial)
    # A multi-node candidate is "a,b": node 0 first, the others after it.
    here = [c for c in found.candidates if chosen is not None and _first(c.node) == chosen.name]
    best = here[0] if here else (found.candidates[0] if found.candidates else None)
    if best is not None:
        first, *others = best.node.split(",")
        initial["node"] = Node.objects.get(name=first).pk
        if others:
            initial.setdefault("other_nodes", ",".join(others))
        initial.setdefault("gpus", ",".join(str(i) for i in best.gpus))
    return found


def _first(names: str) -> str:
    return names.split(",", 1)[0]


def _node_named_by(initial: dict[str, Any]) -> Node | None:
    text = str(initial.get("node", ""))
    return Node.objects.filter(pk=int(text)).first() if text.isdigit() and len(text) < 10 else None


def _chosen_node(asked: Node | None, placed: placement.Placement | None) -> dict[str, Any]:
    """The node a link chose (``?node=``) where the revision does not fit now: ``{"name",
    "reasons"}`` (why not); ``{}`` where it fits or no link chose one."""
    if (
        placed is None
        or asked is None
        or any(_first(c.node) == asked.name for c in placed.candidates)
    ):
        return {}
    reasons = next((r.reasons for r in placed.refused if r.node == asked.name), [])
    return {"name": asked.name, "reasons": reasons}


def launch_query(revision: ProfileRevision, **more: Any) -> str:
    """The launch form's query that opens with ``revision``: ``profile=NAME&revision=N`` (what
    an operator reads as NAME@N), then ``more`` (``node``, ``gpus``, ``port``)."""
    return urlencode({"profile": revision.profile.name, "revision": revision.number, **more})


def _revision_named(profile: str | None, number: str | None, user: Any) -> ProfileRevision | None:
    """Revision ``number`` of the profile named ``profile``, if ``user`` may see it."""
    if not profile or not number or not number.isdigit() or len(number) > 9:
        return None
    return (
        ProfileRevision.objects.select_related("profile")
        .filter(profile__in=visible_profiles(user), profile__name=profile, number=int(number))
        .first()
    )


def _visible_revision(pk: Any, user: Any) -> ProfileRevision | None:
    try:
        return ProfileRevision.objects.select_related("profile").get(
            pk=int(pk), profile__in=visible_profiles(user)
        )
    except (TypeError, ValueError, OverflowError, ProfileRevision.DoesNotExist):
        return None


def _preset(form: LaunchForm, user: Any) -> dict[str, str] | None:
    """The revision the form launches, spelled out (masked) when it is not in the choices
    shown: an ad-hoc command's revision, or one just saved from a diagnosis's fix."""
    revision = _visible_revision(form["adhoc_revision"].value() or form["revision"].value(), user)
    if revision is None:
        return None
    masked = redact_args(list(revision.args))
    return {
        "name": str(revision),
        "command": shlex.join(["python3", "-m", "sglang.launch_server", *masked]),
        "message": revision.message,
    }


def _group_nodes(launch: Launch) -> list[dict[str, Any]]:
    """``[{"launch", "node", "rank", "status", "phase", "gpus", "port"}]`` of a multi-node
    launch's nodes in rank order (node 0's launch is the group); ``[]`` on one node."""
    first = launch.group if launch.group_id else launch
    assert first is not None
    parts = list(first.parts.select_related("node").order_by("node_rank"))
    if not parts:
        return []
    return [
        {
            "launch": m,
            "node": m.node.name,
            "rank": m.node_rank,
            "status": m.status,
            "phase": phase_label(Progress.from_json(m.progress).phase),
            "gpus": m.gpu_list(),
            "port": m.port,
        }
        for m in [first, *parts]
    ]


def _state_context(launch: Launch) -> dict[str, Any]:
    """What the polled state part of the launch page shows: the diagnosis first when the
    launch failed, the phase bar (frozen where a failed launch stopped), checks, the memory
    timeline, the estimate beside the server's figures."""
    progress = Progress.from_json(launch.progress)
    diagnosis = fixes.stored(launch)
    estimate = launch.estimate or {}
    info = launch.server_info or {}
    group = _group_nodes(launch)
    return {
        "launch": launch,
        "progress": progress,
        "percent": round(progress.fraction() * 100),
        "phase_label": phase_label(progress.phase),
        "phases": _phases(
            progress,
            bool(
                launch_flags.flags_for(launch.revision, launch.node).get(
                    "enable_hierarchical_cache", default=False
                )
            ),
        ),
        "failed_checks": [c for c in launch.checks or [] if not c.get("passed")],
        # A multi-node launch: each node's part, its status and phase (node 0 first).
        "group_nodes": group,
        "checks_have_nodes": any(c.get("node") for c in launch.checks or []),
        "comparison": _comparison(estimate, info, progress),
        "calibration": estimate.get("calibration") or {},
        "usage": info.get("memory_usage") or {},
        "ended": launch.status in LAUNCH_ENDED,
        # A failed launch is diagnosed right after it fails, again once its log is whole.
        "settled": launch.status in LAUNCH_ENDED
        and (launch.status != LaunchStatus.FAILED or (launch.diagnosis and launch.log_complete))
        and all(n["status"] in LAUNCH_ENDED for n in group),
        # A part's Stop stops the whole launch (ending.stop goes to node 0's): offered while
        # the launch as a whole runs.
        "stoppable": (launch.group or launch).status not in LAUNCH_ENDED,
        # GPUs an ended launch still holds: their memory did not come back when it ended.
        "held_gpus": list(launch.reservations.filter(kind="gpu").values_list("number", flat=True))
        if launch.status in LAUNCH_ENDED
        else [],
        "diagnosis": diagnosis,
        "fix": remedy.describe(diagnosis["changes"]) if diagnosis else "",
        # A node of rank ≥ 1 serves no requests (only a dummy /health): node 0's launch does.
        "endpoint": _endpoint(launch)
        if launch.status == LaunchStatus.READY and launch.group_id is None
        else None,
        "effective": _effective(launch.server_info),
        # In the polled part, so a launch that pre-flight blocks offers it without a reload.
        "relaunch": _relaunch_form(launch)
        if launch.status == LaunchStatus.BLOCKED and launch.group_id is None
        else None,
        "blocked_fix": remedy.describe(fixes.blocked_fix(launch))
        if launch.status == LaunchStatus.BLOCKED
        else "",
        "charts": timeline.charts(
            launch.memory_timeline or [],
            {g.index: g.memory_total_bytes for g in launch.node.gpus.all()},
            _chart_events(launch, diagnosis),
        ),
        **_load_charts(launch.metrics_series or []),
        "bottleneck": capacity.bottleneck_of(launch) if launch.metrics_series else None,
    }


def _load_charts(series: list[dict[str, Any]]) -> dict[str, Any]:
    """The load plots: the latest hour, and for a launch older than that its whole life too
    (thinned as it was stored)."""
    end = max((float(s.get("t") or 0) for s in series), default=0.0)
    if end <= timeline.RECENT_S:
        return {"load_charts": timeline.load_charts(series), "life_charts": []}
    return {
        "load_charts": timeline.load_charts(series, since=end - timeline.RECENT_S),
        "life_charts": timeline.load_charts(series),
    }


def _chart_events(launch: Launch, diagnosis: dict[str, Any] | None) -> list[timeline.Event]:
    """What the memory charts mark: ready, and at the end the kernel's OOM kills and a CUDA
    out-of-memory with the figures their messages gave (the sampler can miss the moment)."""
    if launch.started is None:
        return []
    events = []
    if launch.ready_at is not None:
        t = (launch.ready_at - launch.started).total_seconds()
        events.append(timeline.Event("all", "ready", t, f"ready after {t:,.0f} s"))
    if launch.ended is None:
        return events
    end = (launch.ended - launch.started).total_seconds()
    events += timeline.kill_events((launch.snapshot or {}).get("oom_lines") or [], end)
    numbers = (diagnosis or {}).get("numbers") or {}
    total, free = (
        numbers.get("gpu_total_gib"),
        numbers.get("free_gib_at_oom", numbers.get("free_gib")),
    )
    if isinstance(total, int | float) and isinstance(free, int | float):
        label = (
            f"CUDA out of memory: {total - free:.2f} of {total:.2f} GiB in use, "
            f"{numbers.get('tried_to_allocate_gib', '?')} GiB more asked (PyTorch's message)"
        )
        events.append(timeline.Event("gpu", "oom", end, label))
    return events


def _phases(progress: Progress, hicache: bool) -> list[dict[str, Any]]:
    """The phase bar: each start-up phase, done, current or to come; the host pool's only
    with hierarchical cache (without it SGLang allocates none, so it is never "done")."""
    reached = [key for key, _ in PHASES].index(progress.phase) if progress.phase else -1
    return [
        {"key": key, "label": label, "done": i < reached, "current": i == reached}
        for i, (key, label) in enumerate(PHASES)
        if hicache or key != "host_pool"
    ]


def _comparison(
    estimate: dict[str, Any], info: dict[str, Any], progress: Progress
) -> list[tuple[str, Any, Any, str]]:
    """``(figure, estimated, observed, error)`` rows: the budget's estimate beside what the
    server logged and reported, the error in percent of the observed figure."""
    weights = estimate.get("weights_bytes_per_rank")
    free = estimate.get("free_before_load_bytes")
    pool = estimate.get("host_pool_bytes_per_rank")
    numbers = progress.numbers
    rows = [
        (
            "Device KV pool (tokens per rank)",
            estimate.get("device_kv_tokens_per_rank"),
            info.get("max_total_num_tokens") or numbers.get("max_total_num_tokens"),
        ),
        ("Weights per rank (GiB)", round(weights / 2**30, 2) if weights else None,
         numbers.get("weights_gib")),
        ("Free GPU memory before weights (GiB)", round(free / 2**30, 2) if free else None,
         numbers.get("avail_mem_gib")),
        ("Host pool per rank (GB)", round(pool / 1e9, 2) if pool else None,
         numbers.get("host_pool_gb")),
    ]  # fmt: skip
    return [
        (label, est, real, f"{(est - real) / real * 100:+.1f} %" if est and real else "—")
        for label, est, real in rows
    ]


@require_GET
@login_required
def launch_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    launch = get_object_or_404(_seen(request).select_related("node", "revision__profile"), pk=pk)
    if request.htmx and request.GET.get("part") == "state":
        return render(request, "nodes/launch_detail.html#state", _state_context(launch))
    shown = log_view.window(launch, limit=LINES_SHOWN)
    lines = shown.rows
    state = _state_context(launch)
    evidence = log_view.evidence_lines(launch)
    context = {
        **state,
        "lines": lines,
        "more_before": shown.more_before,
        "decode_pattern": DECODE_BATCH.pattern,
        "ranks": log_view.ranks(launch),
        "log_nodes": log_view.nodes(launch),
        "evidence_lines": evidence,
        "last_seq": lines[-1][0] if lines else 0,
        "snapshot_json": json.dumps(launch.snapshot, indent=1) if launch.snapshot else "",
    }
    return render(request, "nodes/launch_detail.html", context)


#: The server's own settings the card shows, in this order, from ``/get_server_info``
#: (SGLang's ServerArgs as resolved, plus ``max_total_num_tokens`` and ``version``).
EFFECTIVE_SETTINGS = (
    "version", "model_path", "tp_size", "dp_size", "pp_size", "mem_fraction_static",
    "max_total_num_tokens", "context_length", "max_running_requests", "chunked_prefill_size",
    "kv_cache_dtype", "page_size", "cuda_graph_max_bs", "attention_backend",
    "enable_hierarchical_cache", "hicache_size", "hicache_ratio", "enable_metrics",
)  # fmt: skip


def _effective(info: Any) -> list[tuple[str, str]]:
    """``(setting, value)`` of the ones the server reported, in ``EFFECTIVE_SETTINGS`` order."""
    if not isinstance(info, dict):
        return []
    shown = []
    for key in EFFECTIVE_SETTINGS:
        value = info.get(key)
        if value is None and isinstance(info.get("internal_states"), list) and key != "version":
            first = info["internal_states"][0] if info["internal_states"] else {}
            value = first.get(key) if isinstance(first, dict) else None
        if value is not None and not isinstance(value, dict | list):
            shown.append(
                (key, f"{value:,}" if isinstance(value, int) and value > 9999 else str(value))
            )
    return shown


def _endpoint(launch: Launch) -> endpoints.Endpoint:
    """Where the ready server answers: its --host (SGLang's default is the loopback)."""
    args = [str(a) for a in launch.revision.args or []]
    bind = next(
        (
            args[i + 1] if a == "--host" else a.split("=", 1)[1]
            for i, a in enumerate(args)
            if (a == "--host" and i + 1 < len(args)) or a.startswith("--host=")
        ),
        None,
    )
    node = launch.node
    return endpoints.endpoint(bind, node.host, launch.port, node.port, node.ssh_user)


def _relaunch_form(launch: Launch) -> LaunchForm:
    """*Launch again* for a blocked launch: the same revision, node, GPUs and port, its failed
    checks ticked to override."""
    return LaunchForm(
        initial={
            "revision": None if launch.adhoc else launch.revision_id,
            "adhoc_revision": launch.revision_id if launch.adhoc else None,
            "port": launch.port,
            "node": launch.node_id,
            "other_nodes": ",".join(
                launch.parts.order_by("node_rank").values_list("node__name", flat=True)
            ),
            "gpus": launch.gpu_list(),
            "override": sorted({c["name"] for c in launch.checks or [] if not c.get("passed")}),
        }
    )


@require_POST
@role_required(Role.OPERATOR)
def launch_stop(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    launch = get_object_or_404(_seen(request), pk=pk)
    if launch.status in LAUNCH_ENDED:
        messages.info(request, f"Launch #{launch.pk} already ended ({launch.status}).")
    else:
        send("nodes.stop_launch", launch.pk, request.user.pk)  # QueueUnavailable: 503
        # Transient: the page drops it when the launch's log ends (static/js/app.js).
        messages.success(request, f"Stopping launch #{launch.pk}…", extra_tags="transient")
    return after_post(request, reverse("nodes:launch-detail", args=[launch.pk]))


@require_GET
@login_required
def launch_bundle(request: HttpRequest, pk: int) -> HttpResponse:
    """The launch as a ``rankwise-case/1`` bundle (log and facts, secrets masked)."""
    launch = get_object_or_404(_seen(request).select_related("node", "revision__profile"), pk=pk)
    response = HttpResponse(bundles.launch_bundle(launch), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="launch-{launch.pk}.tar.gz"'
    return response


@require_POST
@role_required(Role.OPERATOR)
def launch_promote(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Save an ad-hoc launch's revision as a new named profile (revision 1), re-validated on
    its node; then open the profile."""
    launch = get_object_or_404(_seen(request).select_related("node", "revision__profile"), pk=pk)
    if not launch.adhoc:
        messages.info(request, f"{launch.revision} is a named profile already.")
        return after_post(request, reverse("nodes:launch-detail", args=[launch.pk]))
    try:
        revision = profiles.promote(
            launch.revision,
            str(request.POST.get("name", ""))[:200],
            actor=request.user,
            request=request,
            wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
        )
    except profiles.PromoteRefused as exc:
        messages.error(request, f"Not saved: {exc}.")
        return after_post(request, reverse("nodes:launch-detail", args=[launch.pk]))
    messages.success(request, f"Saved {revision} from launch #{launch.pk}.")
    return after_post(request, reverse("nodes:profile-detail", args=[revision.profile_id]))


@require_POST
@role_required(Role.OPERATOR)
def launch_apply_fix(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Save the diagnosis's suggested change as the profile's next revision, re-validated on
    the launch's node, then open the launch form with it. Another team's launch is 404: its
    profile is not theirs to write to."""
    launch = get_object_or_404(_seen(request).select_related("node", "revision__profile"), pk=pk)
    try:
        revision, created = fixes.apply_fix(
            launch,
            actor=request.user,
            request=request,
            wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
        )
    except fixes.FixError as exc:
        messages.error(request, str(exc))
        return after_post(request, reverse("nodes:launch-detail", args=[launch.pk]))
    if created:
        messages.success(
            request,
            f"Saved {revision} ({revision.message}); budget on {launch.node.name}: "
            f"{revision.verdict}.",
        )
    else:
        messages.info(request, f"The fix is already saved as {revision} ({revision.message}).")
    query = launch_query(revision, node=launch.node_id, gpus=launch.gpu_list(), port=launch.port)
    return after_post(request, f"{reverse('nodes:launch-create')}?{query}")


@require_http_methods(["GET", "POST"])
@login_required
def bundle_diagnose(request: HtmxHttpRequest) -> HttpResponseBase:
    """Upload a bundle (``.tar.gz`` of a ``rankwise-case/1`` folder) from any server: it is kept
    for a worker, which reads it with bounds and diagnoses it; the result page polls."""
    form = BundleUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        job = bundle_uploads.store(form.cleaned_data["bundle"], request.user)
        try:
            # The job's id is the task's, so a caller can wait on the task by the page's URL.
            send("nodes.diagnose_upload", str(job.pk), task_id=str(job.pk))
        except QueueUnavailable:
            job.delete()
            form.add_error(None, "The task queue (Redis) does not answer; nothing was diagnosed.")
        else:
            return redirect(reverse("nodes:bundle-diagnosis", args=[job.pk]))
    return render(request, "nodes/bundle_diagnose.html", {"form": form})


@require_GET
@login_required
def bundle_diagnosis(request: HtmxHttpRequest, pk: str) -> HttpResponse:
    """An uploaded bundle's diagnosis, for the user who uploaded it (pending: the page polls)."""
    job = get_object_or_404(BundleUpload.objects.defer("data"), pk=pk, owner=request.user)
    result = job.result or {}
    context = {
        "form": BundleUploadForm(),
        "job": job,
        "pending": job.status == BundleUpload.Status.PENDING,
        "error": result.get("error"),
        "diagnosis": result.get("diagnosis"),
        "summary": result.get("summary"),
        "excerpts": result.get("excerpts") or [],
        "line_count": result.get("line_count"),
        "change": result.get("change") or "",
        "name": job.name,
    }
    return render(request, "nodes/bundle_diagnose.html", context)


#: Polls of a test request the page makes (0.5 s apart) before it says no worker answered.
TEST_REQUEST_POLLS = 240


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def launch_test_request(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """POST: send the ready server a short ``/generate`` (a worker does, through SSH); GET with
    ``?reading=``: that request's answer and latency once the worker has it (the page polls)."""
    launch = get_object_or_404(_seen(request).select_related("node"), pk=pk)
    context: dict[str, Any] = {"launch": launch}
    if request.method == "POST":
        if launch.group_id is not None:
            context["error"] = (
                f"launch #{launch.pk} is node rank {launch.node_rank} of launch "
                f"#{launch.group_id}, which serves the requests: test that one"
            )
        elif launch.status != LaunchStatus.READY:
            context["error"] = f"launch #{launch.pk} is {launch.get_status_display().lower()}"
        else:
            reading = str(uuid.uuid4())
            send("nodes.test_request", launch.pk, task_id=reading)
            context.update(reading=reading, tries=1)
        return render(request, "nodes/_test_request.html", context)
    text = request.GET.get("tries", "")
    tries = int(text) if re.fullmatch(r"[0-9]{1,4}", text) else 0
    state = task_state(request.GET.get("reading", ""), "test request")
    if state is None:
        context["error"] = "no test request was asked"
    elif state.running:
        if tries >= TEST_REQUEST_POLLS:
            context["error"] = "no worker answered (is a Celery worker running?)"
        else:
            context.update(reading=state.id, tries=tries + 1)
    elif state.error:
        context["error"] = state.error
    elif (
        isinstance(state.result, dict)
        and state.result.get("kind") == test_requests.KIND
        and state.result.get("launch") == launch.pk
    ):
        context["result"] = state.result
    else:
        context["error"] = "that answer is not of this launch: send the request again"
    return render(request, "nodes/_test_request.html", context)


@require_GET
@login_required
def launch_capacity(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """What would lift the server: the advisor's options, each checked by the budget."""
    launch = get_object_or_404(_seen(request).select_related("node", "revision__profile"), pk=pk)
    context = {"launch": launch, "found": capacity.capacity_of(launch)}
    return render(request, "nodes/_capacity.html", context)


@require_POST
@role_required(Role.OPERATOR)
def launch_capacity_apply(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Save an offered option as the profile's next revision (re-validated), then open the
    launch form with it."""
    launch = get_object_or_404(_seen(request).select_related("node", "revision__profile"), pk=pk)
    try:
        change = json.loads(str(request.POST.get("change", ""))[:2000])
        if not isinstance(change, dict):
            raise ValueError
        revision = capacity.apply_option(launch, change, actor=request.user, request=request)
    except (ValueError, capacity.CapacityRefused) as exc:
        said = str(exc) if isinstance(exc, capacity.CapacityRefused) else "not a change"
        messages.error(request, f"Not saved: {said}.")
        return after_post(request, reverse("nodes:launch-detail", args=[launch.pk]))
    said = f"Saved {revision} ({revision.message}); {revision.verdict}."
    port = reservations.free_port(launch.node, launch.port)
    if port != launch.port:
        said += f" Port {launch.port} is still held, so the relaunch takes port {port}."
    messages.success(request, said)
    query = launch_query(revision, node=launch.node_id, port=port)
    return after_post(request, f"{reverse('nodes:launch-create')}?{query}")
