"""The user's API tokens: made here (shown once), listed by name and prefix, revoked."""

from __future__ import annotations

from typing import cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from nodes.models import ApiToken
from nodes.services import tokens
from nodes.views import HtmxHttpRequest, _redirect


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
        return _redirect(request, reverse("nodes:token-list"))
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
    return _redirect(request, reverse("nodes:token-list"))


def _me(request: HtmxHttpRequest) -> AbstractBaseUser:
    return cast(AbstractBaseUser, request.user)  # login_required let only a real user in
