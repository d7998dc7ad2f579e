"""Inventory pages: nodes (list, page, live facts, discovery, host keys, maintenance, edit) and
SSH keys. Each view checks the role, binds the form, calls a service, renders a page or partial."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Prefetch
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nodes.forms.inventory import CredentialForm, NodeForm
from nodes.models import AuditEntry, Gpu, Node, SshCredential
from nodes.models.choices import Role
from nodes.queue import QueueUnavailable, send
from nodes.services import fleet, teams
from nodes.services.audit import record
from nodes.services.credentials import create_credential, delete_credential
from nodes.services.hostkeys import offer_host_key, trust_host_key
from nodes.services.inventory import delete_node, save_node, set_maintenance
from nodes.ssh import RemoteError
from nodes.views.http import HtmxHttpRequest, after_post, role_required, task_state


def _nodes_with_gpus() -> list[Node]:
    return list(Node.objects.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.all())))


@require_GET
@login_required
def node_list(request: HtmxHttpRequest) -> HttpResponse:
    template = "nodes/node_list.html#node-table" if request.htmx else "nodes/node_list.html"
    return render(request, template, {"nodes": _nodes_with_gpus()})


@require_GET
@login_required
def fleet_page(request: HtmxHttpRequest) -> HttpResponse:
    """Every node's GPUs and host RAM by owner, from the database; polls itself."""
    template = "nodes/fleet.html#fleet-bars" if request.htmx else "nodes/fleet.html"
    return render(request, template, {"views": fleet.fleet(request.user)})


@require_GET
@login_required
def node_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(
        Node.objects.prefetch_related("gpus").select_related("credential"), pk=pk
    )
    user = request.user
    nodes_own = AuditEntry.objects.filter(object_type="node", object_id=str(node.pk))
    history = teams.visible_audit(user, nodes_own)[:20]
    events = list(node.events.all()[:20])
    for event, message in zip(
        events, teams.mask_launch_ids(user, [e.message for e in events]), strict=True
    ):
        event.message = message
    launches = teams.visible_launches(user).filter(node=node).select_related("revision__profile")
    # Another team's own launch shows only as the GPUs it holds.
    team_only_gpus = sorted(
        node.reservations.filter(kind="gpu", launch__in=teams.hidden_launches(user)).values_list(
            "number", flat=True
        )
    )
    context = {
        "node": node,
        "history": history,
        "events": events,
        "launches": launches[:10],
        "team_only_gpus": team_only_gpus,
        "task_id": None,
        "owners": {g.owners.index: g for g in fleet.node_view(node, user).gpus},
    }
    return render(request, "nodes/node_detail.html", context)


@require_GET
@login_required
def node_live(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The node's live facts; while ``?task=ID`` (a discovery) runs, the fragment keeps polling."""
    node = get_object_or_404(Node.objects.prefetch_related("gpus"), pk=pk)
    state = task_state(request.GET.get("task", ""), "discovery")
    outcome = state.result if state is not None else None
    error = state.error if state is not None else None
    if isinstance(outcome, dict) and outcome.get("error"):
        error = outcome["error"]
    context = {
        "node": node,
        "task_id": state.id if state is not None and state.running else None,
        # A discovery that ended keeps saying how it ended as the section refreshes.
        "ended_task": state.id if state is not None and not state.running else None,
        "finished": state is not None and not state.running and not error,
        "discovery_error": error,
        "owners": {g.owners.index: g for g in fleet.node_view(node, request.user).gpus},
    }
    return render(request, "nodes/node_detail.html#node-live", context)


@require_POST
@role_required(Role.OPERATOR)
def node_discover(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(Node, pk=pk)
    if not node.host_key:
        messages.error(request, f"Trust {node.name}'s host key first: nothing runs on it before.")
        return after_post(request, reverse("nodes:node-detail", args=[node.pk]))
    task_id = str(uuid.uuid4())
    send("nodes.discover_node", node.pk, task_id=task_id)  # QueueUnavailable: 503
    record("node.discover", actor=request.user, obj=node, request=request)
    if request.htmx:
        node = Node.objects.prefetch_related("gpus").get(pk=pk)
        owners = {g.owners.index: g for g in fleet.node_view(node, request.user).gpus}
        context = {"node": node, "task_id": task_id, "owners": owners}
        return render(request, "nodes/node_detail.html#node-live", context)
    messages.info(request, f"Discovery of {node.name} started.")
    return redirect(reverse("nodes:node-detail", args=[node.pk]))


@require_POST
@role_required(Role.ADMIN)
def node_fetch_host_key(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(Node, pk=pk)
    try:
        key = offer_host_key(node, actor=request.user, request=request)
    except RemoteError as exc:
        messages.error(request, f"Could not fetch the host key: {exc.message}")
    else:
        messages.info(
            request,
            f"{node.name} presents host key {key.fingerprint}. Trust it only if it is the node's.",
        )
    return after_post(request, reverse("nodes:node-detail", args=[node.pk]))


@require_POST
@role_required(Role.ADMIN)
def node_trust_host_key(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(Node, pk=pk)
    try:
        trust_host_key(
            node, request.POST.get("fingerprint", ""), actor=request.user, request=request
        )
    except RemoteError as exc:
        messages.error(request, exc.message)
    else:
        # The first thing anyone wants after trusting a node is to see it: discover it now.
        try:
            send("nodes.discover_node", node.pk)
        except QueueUnavailable:
            messages.success(request, f"Host key of {node.name} trusted.")
        else:
            messages.success(request, f"Host key of {node.name} trusted; discovering it now.")
    return after_post(request, reverse("nodes:node-detail", args=[node.pk]))


@require_POST
@role_required(Role.ADMIN)
def node_maintenance(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(Node, pk=pk)
    wanted = request.POST.get("on")
    if wanted not in ("0", "1"):
        messages.error(request, "Say on=1 (maintenance) or on=0 (back in service).")
    elif (wanted == "1") != (node.status == "maintenance"):
        set_maintenance(node, wanted == "1", actor=request.user, request=request)
    return after_post(request, reverse("nodes:node-detail", args=[node.pk]))


@require_GET
@role_required(Role.ADMIN)
def credential_list(request: HtmxHttpRequest) -> HttpResponse:
    credentials = SshCredential.objects.annotate(node_count=Count("nodes"))
    return render(request, "nodes/credential_list.html", {"credentials": credentials})


@sensitive_variables("data", "form")
@sensitive_post_parameters("private_key", "passphrase")
@require_http_methods(["GET", "POST"])
@role_required(Role.ADMIN)
def credential_create(request: HtmxHttpRequest) -> HttpResponseBase:
    form = CredentialForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            credential = create_credential(
                data["name"],
                data["key_text"],
                data.get("passphrase") or None,
                actor=request.user,
                request=request,
            )
        except RemoteError as exc:
            form.add_error("private_key", exc.message)
        else:
            messages.success(
                request, f"Key {credential.name} ({credential.fingerprint}) stored, encrypted."
            )
            return after_post(request, reverse("nodes:credential-list"))
    return render(request, "nodes/credential_form.html", {"form": form})


@require_POST
@role_required(Role.ADMIN)
def credential_delete(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    credential = get_object_or_404(SshCredential, pk=pk)
    if credential.nodes.exists():
        names = ", ".join(credential.nodes.values_list("name", flat=True))
        messages.error(
            request, f"Key {credential.name} is used by {names}; change those nodes first."
        )
    else:
        delete_credential(credential, actor=request.user, request=request)
        messages.success(request, f"Key {credential.name} deleted.")
    return after_post(request, reverse("nodes:credential-list"))


@require_http_methods(["GET", "POST"])
@role_required(Role.ADMIN)
def node_create(request: HtmxHttpRequest) -> HttpResponseBase:
    return _node_form(request, Node())


@require_http_methods(["GET", "POST"])
@role_required(Role.ADMIN)
def node_edit(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    return _node_form(request, get_object_or_404(Node, pk=pk))


def _node_form(request: HtmxHttpRequest, node: Node) -> HttpResponseBase:
    creating = node.pk is None
    form = NodeForm(request.POST or None, instance=node)
    if request.method == "POST" and form.is_valid():
        node = save_node(
            form.save, before=form.snapshot_before, actor=request.user, request=request
        )
        messages.success(request, f"Node {node.name} {'added' if creating else 'saved'}.")
        return after_post(request, reverse("nodes:node-detail", args=[node.pk]))
    template = "nodes/node_form.html#node-form" if request.htmx else "nodes/node_form.html"
    return render(request, template, {"form": form, "node": node, "creating": creating})


@require_POST
@role_required(Role.ADMIN)
def node_delete(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(Node, pk=pk)
    name = node.name
    delete_node(node, actor=request.user, request=request)
    messages.success(request, f"Node {name} deleted.")
    return after_post(request, reverse("nodes:node-list"))
