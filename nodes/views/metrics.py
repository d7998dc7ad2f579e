"""``/metrics``: the panel's view of every running server for Prometheus, from what the
followers last read (``Launch.metrics``): one gauge per SGLang load figure, labelled with the
launch, its node and its profile (a team-only profile's name is not exposed). A bearer token
(an API token, any role) is required, as for the API: Prometheus's ``authorization``
``credentials``."""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from nodes.domain.server_metrics import WANTED
from nodes.models import Launch, LaunchProfile
from nodes.models.choices import LAUNCH_ENDED
from nodes.services import tokens

#: What each exported gauge says (the server's own gauge of the same name, as last read).
HELP = {
    "token_usage": "Fraction of the server's device KV pool in use (sglang:token_usage)",
    "num_running_reqs": "Requests running (sglang:num_running_reqs)",
    "num_queue_reqs": "Requests waiting (sglang:num_queue_reqs)",
    "gen_throughput": "Generation throughput, tokens/s (sglang:gen_throughput)",
    "cache_hit_rate": "Prefix cache hit rate (sglang:cache_hit_rate)",
    "num_retracted_reqs": "Requests retracted (sglang:num_retracted_reqs)",
}


LABELS = ["launch", "node", "profile"]


class RunningServers(Collector):
    """Every launch that has not ended and has load figures, as gauges."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        launches = (
            Launch.objects.exclude(status__in=LAUNCH_ENDED)
            .exclude(metrics=None)
            .select_related("node", "revision__profile")
        )
        families = {
            name: GaugeMetricFamily(
                f"rankwise_server_{name}", HELP[name], labels=["launch", "node", "profile"]
            )
            for name in WANTED
        }
        up = GaugeMetricFamily(
            "rankwise_server_up",
            "A running server the panel follows",
            labels=["launch", "node", "profile"],
        )
        for launch in launches:
            labels = [str(launch.pk), launch.node.name, _profile_label(launch.revision.profile)]
            up.add_metric(labels, 1)
            for name, value in (launch.metrics or {}).items():
                if name in families and isinstance(value, int | float):
                    families[name].add_metric(labels, float(value))
        yield up
        yield from families.values()


def _profile_label(profile: LaunchProfile) -> str:
    if profile.visibility == LaunchProfile.Visibility.TEAM:
        return "team-only"
    return "ad-hoc" if profile.adhoc else profile.name


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The exposition, for a request with a valid API token; 401 otherwise."""
    header = request.headers.get("Authorization", "")
    token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
    if not token or tokens.user_for(token) is None:
        response = HttpResponse("an API token is needed (Authorization: Bearer …)\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="rankwise"'
        return response
    registry = CollectorRegistry()
    registry.register(RunningServers())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
