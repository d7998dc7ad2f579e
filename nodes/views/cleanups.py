"""GPU holders on the node page, the cleanup form, and a cleanup's checklist."""

from __future__ import annotations

import re
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from nodes import ssh
from nodes.forms.cleanups import CleanupForm
from nodes.models import Launch, Node
from nodes.models.choices import Role
from nodes.services import cleanup, teams
from nodes.views.http import HtmxHttpRequest, after_post, role_required


@require_GET
@role_required(Role.OPERATOR)
def node_gpus(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """The node's "GPU holders" panel: read live over SSH, changes nothing. Operators only:
    nothing runs on a node for a viewer (and every process's command line shows here)."""
    node = get_object_or_404(Node, pk=pk)
    context: dict[str, Any] = {"node": node}
    try:
        context["inspection"] = cleanup.inspect(node)
    except ssh.RemoteError as exc:
        context["error"] = exc.message
    else:
        teams.mask_holders(request.user, context["inspection"].holders)
    return render(request, "nodes/gpu_holders.html", context)


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
    """Choose GPUs and confirm; other holders are listed one by one, each needing its tick."""
    node = get_object_or_404(Node.objects.prefetch_related("gpus"), pk=pk)
    launch = _launch_of(request, node)
    try:
        inspection = cleanup.inspect(node, launch=launch)
    except ssh.RemoteError as exc:
        messages.error(request, f"{node.name} did not answer: {exc.message}")
        return after_post(request, reverse("nodes:node-detail", args=[node.pk]))
    teams.mask_holders(request.user, inspection.holders)
    others = [
        h
        for h in inspection.holders
        if h.gpus
        and h.state not in ("Z", "X")
        and not (launch and h.launch_id == launch.pk)
        # Another team's team-only launch is ended by its team or an admin, not offered here.
        and not h.team_only
    ]
    form = CleanupForm(
        request.POST or None,
        gpu_indexes=[g.index for g in inspection.gpus],
        others=others,
        initial={"gpus": launch.gpus if launch else [g.index for g in inspection.gpus]},
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
            )
        except cleanup.CleanupError as exc:
            form.add_error(None, str(exc))
        else:
            cleanup.queue(job)  # QueueUnavailable: 503 (the middleware), the cleanup ended as error
            return after_post(request, reverse("nodes:cleanup-detail", args=[job.pk]))
    context = {"node": node, "launch": launch, "inspection": inspection, "form": form}
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
