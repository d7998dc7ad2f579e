"""GPU holders on the node page, the cleanup form, and a cleanup's checklist."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from nodes.domain.gpu_holders import Holder
from nodes.forms.cleanups import CleanupForm
from nodes.models import Launch, Node
from nodes.models.choices import Role
from nodes.queue import send
from nodes.services import holders, teams
from nodes.views.http import HtmxHttpRequest, after_post, role_required, task_state
from nodes.workflows import cleanup

#: Polls of a holders reading before the page says no worker answered (a quarter second apart).
READING_POLLS = 240


@require_GET
@role_required(Role.OPERATOR)
def node_gpus(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """The node's "GPU holders" panel: read on the node by a worker (the panel polls until the
    reading is there), changes nothing. Operators only: nothing runs on a node for a viewer
    (and every process's command line shows here)."""
    node = get_object_or_404(Node, pk=pk)
    context = _reading(request, node, None)
    response = render(request, "nodes/gpu_holders.html", context)
    if context.get("inspection") is not None:
        # The reading is stored: the GPU table above shows the same one (it listens for this).
        response["HX-Trigger"] = "node-read"
    return response


def _reading(request: HtmxHttpRequest, node: Node, launch: Launch | None) -> dict[str, Any]:
    """The page's context for the node's holders: the reading named by ``reading`` once a
    worker made it (masked for this user), else a reading queued now, for the page to poll."""
    asked = request.GET.get("reading") or request.POST.get("reading") or ""
    text = request.GET.get("tries", "")
    tries = int(text) if re.fullmatch(r"[0-9]{1,4}", text) else 0
    context: dict[str, Any] = {"node": node, "launch": launch, "tries": tries + 1}
    if not node.host_key:  # nothing is run on a node nobody trusted
        return {**context, "error": f"{node.name}'s host key is not trusted yet"}
    state = task_state(asked, "GPU holders")
    if state is None:
        reading = str(uuid.uuid4())
        send("nodes.read_holders", node.pk, launch.pk if launch else None, task_id=reading)
        return {**context, "reading": reading}
    context["reading"] = state.id
    if state.running:
        if tries >= READING_POLLS:
            return {**context, "error": "no worker answered (is a Celery worker running?)"}
        return context
    doc = state.result if isinstance(state.result, dict) else {}
    if doc.get("node") == node.pk and doc.get("error"):
        return {**context, "error": doc["error"]}
    inspection = holders.reading_from_json(state.result, node, launch)
    if inspection is None:
        return {**context, "error": state.error or "that reading is not of this page: reload it"}
    teams.mask_holders(request.user, inspection.holders)
    return {**context, "inspection": inspection}


def _launch_of(request: HtmxHttpRequest, node: Node) -> Launch | None:
    """The launch the cleanup is about, if the page names one; 404 for one not on this node
    or another team's own."""
    text = request.GET.get("launch") or request.POST.get("launch") or ""
    if not text:
        return None
    launch = (
        teams.visible_launches(request.user).filter(pk=int(text), node=node).first()
        if re.fullmatch(r"[0-9]{1,9}", text)
        else None
    )
    if launch is None:
        raise Http404(f"no launch {text[:20]!r} on {node.name}")
    return launch


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def node_cleanup(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Choose GPUs and confirm; other holders are listed one by one, each needing its tick.
    What is offered is what the reading the page showed holds (``reading``): a PID it did not
    offer is refused, and a POST without that reading starts a new one and changes nothing."""
    node = get_object_or_404(Node.objects.prefetch_related("gpus"), pk=pk)
    launch = _launch_of(request, node)
    context = _reading(request, node, launch)
    inspection: holders.Inspection | None = context.get("inspection")
    if inspection is None:
        if request.method == "POST":
            messages.error(request, "The node was not read yet: nothing was done. Check again.")
        return _cleanup_page(request, context)
    form = CleanupForm(
        request.POST or None,
        gpu_indexes=[g.index for g in inspection.gpus],
        others=_others(inspection, launch),
        initial={"gpus": launch.gpus if launch else holders.stuck_gpus(inspection)},
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = cleanup.request(
                node,
                actor=request.user,
                launch=launch,
                gpus=data["gpus"],
                foreign_pids=data.get("foreign") or [],
                foreign_starts={
                    h.pid: h.start
                    for h in _others(inspection, launch)
                    if h.pid in (data.get("foreign") or [])
                },
            )
        except cleanup.CleanupError as exc:
            form.add_error(None, str(exc))
        else:
            cleanup.queue(job)  # QueueUnavailable: 503 (the middleware), the cleanup ended as error
            return after_post(request, reverse("nodes:cleanup-detail", args=[job.pk]))
    return _cleanup_page(request, {**context, "form": form})


def _others(inspection: holders.Inspection, launch: Launch | None) -> list[Holder]:
    """Holders the form may offer to kill: live, on a GPU, not the launch's own, not another
    team's team-only launch's (ended by its team or an admin, not offered here), and not a
    running launch's (it is stopped, not cleaned up)."""
    running = set(cleanup.running_launches(h.launch_id for h in inspection.holders))
    return [
        h
        for h in inspection.holders
        if h.gpus
        and h.state not in ("Z", "X")
        and not (launch and h.launch_id == launch.pk)
        and not h.team_only
        and h.launch_id not in running
    ]


def _cleanup_page(request: HtmxHttpRequest, context: dict[str, Any]) -> HttpResponse:
    if request.htmx and request.method == "GET":
        return render(request, "nodes/cleanup_form.html#cleanup-reading", context)
    return render(request, "nodes/cleanup_form.html", context)


@require_GET
@login_required
def cleanup_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A cleanup as a checklist: each step, its command, output and memory before/after."""
    job = get_object_or_404(
        teams.visible_cleanups(request.user).select_related("node", "launch"), pk=pk
    )
    context = {"cleanup": job, "steps": list(job.steps.all())}
    if request.htmx and request.GET.get("part") == "steps":
        return render(request, "nodes/cleanup_detail.html#steps", context)
    return render(request, "nodes/cleanup_detail.html", context)
