"""Accounts: the user's API tokens (made here, shown once, listed by name and prefix, revoked)
and the audit trail."""

from __future__ import annotations

import re
from typing import cast
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser
from django.core.paginator import Paginator
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nodes.models import ApiToken, AuditEntry
from nodes.services import teams, tokens
from nodes.views.http import HtmxHttpRequest, after_post


@require_http_methods(["GET", "POST"])
@login_required
def token_list(request: HtmxHttpRequest) -> HttpResponseBase:
    if request.method == "POST":
        name = request.POST.get("name", "").strip()[:100]
        if not name or "\x00" in name:
            messages.error(request, "Give the token a name (what will use it).")
        else:
            # Shown once, on the page the browser is sent to: a reload makes no new token.
            request.session["new_token"] = tokens.create(_me(request), name, request=request)
        return after_post(request, reverse("nodes:token-list"))
    new = request.session.pop("new_token", None)
    rows = ApiToken.objects.filter(user_id=_me(request).pk)
    return render(request, "nodes/token_list.html", {"tokens": rows, "new_token": new})


@require_POST
@login_required
def token_revoke(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    if tokens.revoke(_me(request), pk, request=request):
        messages.success(request, "Token revoked: it no longer opens the API.")
    else:
        messages.error(request, "No such live token of yours.")
    return after_post(request, reverse("nodes:token-list"))


def _me(request: HtmxHttpRequest) -> AbstractBaseUser:
    return cast(AbstractBaseUser, request.user)  # login_required let only a real user in


@require_GET
@login_required
def audit_list(request: HtmxHttpRequest) -> HttpResponse:
    entries = teams.visible_audit(request.user, AuditEntry.objects.select_related("actor"))
    action = request.GET.get("action", "").strip()
    if not re.fullmatch(r"[a-z_.]{0,64}", action):
        action = ""
    actor = request.GET.get("actor", "").strip()
    if not re.fullmatch(r"[\w.@+-]{0,150}", actor):
        actor = ""
    kind = request.GET.get("object_type", "").strip()
    if not re.fullmatch(r"[a-z_]{0,64}", kind):
        kind = ""
    if action:
        entries = entries.filter(action__startswith=action)
    if actor:
        entries = entries.filter(actor_name__icontains=actor)
    if kind:
        entries = entries.filter(object_type=kind)
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    filters = {"action": action, "actor": actor, "object_type": kind}
    context = {
        "page": page,
        **filters,
        "kinds": AuditEntry.objects.order_by("object_type")
        .values_list("object_type", flat=True)
        .distinct(),
        "query": urlencode({k: v for k, v in filters.items() if v}),
    }
    return render(request, "nodes/audit_list.html", context)
