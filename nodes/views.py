"""Function views: check the role, bind the form, call a service, render a page or partial."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from nodes.choices import Role
from nodes.forms import NodeForm
from nodes.models import AuditEntry, Gpu, Node
from nodes.roles import role_required
from nodes.services.inventory import delete_node, save_node


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _redirect(request: HtmxHttpRequest, url: str) -> HttpResponseBase:
    """After a successful POST: a client redirect for htmx, a plain 302 otherwise."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


def _nodes_with_gpus() -> list[Node]:
    return list(Node.objects.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.all())))


@require_GET
@login_required
def node_list(request: HtmxHttpRequest) -> HttpResponse:
    template = "nodes/node_list.html#node-table" if request.htmx else "nodes/node_list.html"
    return render(request, template, {"nodes": _nodes_with_gpus()})


@require_GET
@login_required
def node_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.prefetch_related("gpus"), pk=pk)
    history = AuditEntry.objects.filter(object_type="node", object_id=str(node.pk))[:20]
    return render(request, "nodes/node_detail.html", {"node": node, "history": history})


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
        node = save_node(form, actor=request.user, request=request)
        messages.success(request, f"Node {node.name} {'added' if creating else 'saved'}.")
        return _redirect(request, reverse("nodes:node-detail", args=[node.pk]))
    template = "nodes/node_form.html#node-form" if request.htmx else "nodes/node_form.html"
    return render(request, template, {"form": form, "node": node, "creating": creating})


@require_POST
@role_required(Role.ADMIN)
def node_delete(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(Node, pk=pk)
    name = node.name
    delete_node(node, actor=request.user, request=request)
    messages.success(request, f"Node {name} deleted.")
    return _redirect(request, reverse("nodes:node-list"))


@require_GET
@login_required
def audit_list(request: HtmxHttpRequest) -> HttpResponse:
    entries = AuditEntry.objects.select_related("actor")
    action = request.GET.get("action", "").strip()
    if not re.fullmatch(r"[a-z_.]{0,64}", action):
        action = ""
    if action:
        entries = entries.filter(action__startswith=action)
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    return render(request, "nodes/audit_list.html", {"page": page, "action": action})
