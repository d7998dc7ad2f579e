"""Export and import of launch profiles in the panel, as the API does them (``rankwise-profiles/1``,
``services.exchange``): the same document, the same checks, the same report."""

from __future__ import annotations

import json
import re

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from nodes.forms.exchange import ImportForm
from nodes.models.choices import Role
from nodes.services import exchange, teams
from nodes.services.teams import visible_profiles
from nodes.views.http import HtmxHttpRequest, role_required


@require_GET
@login_required
def profiles_export(request: HtmxHttpRequest) -> HttpResponse:
    """Every profile the user may see (or those ``?name=`` names), with revisions and stamps,
    as a file to download; secret values are written as ``****``, as the API's export."""
    visible = visible_profiles(request.user).filter(adhoc=False)
    wanted = [n for n in request.GET.getlist("name") if "\x00" not in n]
    if wanted:
        visible = visible.filter(name__in=wanted)
    names = list(visible.values_list("name", flat=True))
    doc = exchange.export(names)
    # The file is named after the one profile asked for (a stored name, never the query's
    # text), else the time.
    one = names[0] if wanted and len(names) == 1 else ""
    tag = one if re.fullmatch(r"[A-Za-z0-9._-]{1,63}", one) else ""
    name = f"rankwise-profiles-{tag or timezone.now().strftime('%Y%m%d-%H%M%S')}.json"
    response = HttpResponse(
        json.dumps(doc, indent=2, ensure_ascii=False), content_type="application/json"
    )
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def profiles_import(request: HtmxHttpRequest) -> HttpResponse:
    """An export file brought in: every revision checked first (nothing is saved when one is
    refused); equal revisions skipped, different ones reported as conflicts and left alone."""
    form = ImportForm(request.POST or None, request.FILES or None)
    context: dict[str, object] = {"form": form}
    if request.method == "POST" and form.is_valid():
        try:
            report = exchange.import_(
                form.cleaned_data["document"],
                author=request.user.get_username(),
                writable=lambda p: teams.may_write(request.user, p),
                may_own=lambda t: teams.may_own(request.user, t),
                source=f"the file {_file_name(request)}",
            )
        except exchange.ImportRefused as exc:
            form.add_error("document", f"Nothing was imported: {exc}")
        else:
            exchange.audit_import(report, actor=request.user, request=request)
            context["report"] = report
    return render(request, "nodes/profile_import.html", context)


def _file_name(request: HttpRequest) -> str:
    """The uploaded document's name as the browser sent it, cut and without control characters."""
    upload = request.FILES.get("document")
    name = getattr(upload, "name", "") or "?"
    return "".join(c for c in str(name) if c.isprintable())[:100] or "?"
