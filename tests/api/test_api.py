"""The JSON API: public schema and docs, 401 before anything else without a valid token, the
pages' role rules (a viewer's token changes nothing), and what each part answers."""

from __future__ import annotations

import json
import re
from typing import Any, get_args

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from nodes.domain.exchange_document import ProfileEntry
from nodes.models import (
    ApiToken,
    AuditEntry,
    Cleanup,
    KnownGoodStamp,
    Launch,
    LaunchProfile,
    ProfileRevision,
)
from nodes.services import exchange, tokens
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db(transaction=True)
GB = 10**9
FITS = [
    "--model-path",
    "/m",
    "--tp-size",
    "8",
    "--enable-hierarchical-cache",
    "--hicache-size",
    "37",
]
TOO_BIG = [*FITS[:-1], "300"]


@pytest.fixture
def node():
    return make_node(
        "gpu-01",
        sglang_version="0.5.9",
        mem_available_bytes=440 * GB,
    )


@pytest.fixture
def profile(node):
    p = LaunchProfile.objects.create(name="kimi", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=p, number=1, args=FITS, env={"HF_TOKEN": "hf_secret"}, author="pat", node=node,
        verdict="ok", report={"lines": [], "messages": []}, sglang_version="0.5.9",
    )  # fmt: skip
    KnownGoodStamp.objects.create(
        revision=revision, node=node, node_name="gpu-01", gpu_name="NVIDIA H200", gpu_count=8,
        gpu_memory_bytes=96 * 2**30, host_ram_bytes=449 * GB, sglang_version="0.5.9",
        launched_by="olga", stamped_at=timezone.now(), healthy_seconds=900,
        observed={"max_total_num_tokens": 1000}, estimate={"device_kv_tokens_per_rank": 990},
    )  # fmt: skip
    return p


def bearer(role: str | None) -> dict[str, Any]:
    user = make_user(role or "nobody", role)
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(user, 'test')}"}


def operations() -> list[tuple[str, str]]:
    schema = Client().get("/api/openapi.json").json()
    found = []
    for path, methods in schema["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "1", path).replace("/nodes/1", "/nodes/gpu-01")
        concrete = concrete.replace("/profiles/1", "/profiles/kimi")
        for method in methods:
            found.append((method.upper(), concrete))
    return found


def state() -> tuple[int, ...]:
    return tuple(
        m.objects.count()
        for m in (Launch, LaunchProfile, ProfileRevision, Cleanup, KnownGoodStamp, AuditEntry)
    )


def call(client: Client, method: str, path: str, headers: dict[str, Any], body: Any = None) -> Any:
    if method == "GET":
        return client.get(path, **headers)
    data = json.dumps(body or {})
    return client.generic(method, path, data=data, content_type="application/json", **headers)


def test_the_schema_and_docs_are_public_and_the_docs_need_no_cdn(client):
    schema = client.get("/api/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    for expected in (
        "/api/nodes",
        "/api/nodes/{name}/discover",
        "/api/profiles/{name}/revisions",
        "/api/profiles/validate",
        "/api/profiles/export",
        "/api/profiles/import",
        "/api/profiles/{name}/placement",
        "/api/launches",
        "/api/launches/{launch_id}/log",
        "/api/launches/{launch_id}/stop",
        "/api/nodes/{name}/gpus",
        "/api/nodes/{name}/cleanup",
        "/api/cleanups/{cleanup_id}",
    ):
        assert expected in paths, expected
    body = paths["/api/profiles/import"]["post"]["requestBody"]["content"]["application/json"]
    document = body["schema"]["properties"]
    assert document["format"]["const"] == "rankwise-profiles/1"
    revision = document["profiles"]["items"]["properties"]["revisions"]["items"]
    assert revision["properties"]["number"]["maximum"] == 10**6 and "$ref" not in str(body)
    docs = client.get("/api/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()


def test_every_data_request_without_a_valid_token_is_401_and_changes_nothing(client, node, profile):
    revoked = make_user("gone", "admin")
    token = tokens.create(revoked, "old")
    tokens.revoke(revoked, ApiToken.objects.get(user_id=revoked.pk).pk)
    before = state()
    for method, path in operations():
        if path in ("/api/openapi.json", "/api/docs"):
            continue
        for headers in (
            {},
            {"HTTP_AUTHORIZATION": "Bearer rw_not-a-token"},
            {"HTTP_AUTHORIZATION": f"Bearer {token}"},
            {"HTTP_AUTHORIZATION": "Basic dXNlcjpwYXNz"},
        ):
            response = call(client, method, path, headers, {"node": "gpu-01", "args": FITS})
            assert response.status_code == 401, (method, path, headers, response.content)
    # Authentication comes before reading the body: a broken one is still a 401.
    broken = client.post("/api/profiles/kimi/revisions", "{", content_type="application/json")
    assert broken.status_code == 401
    assert state() == before


def test_a_viewer_reads_everything_and_every_mutating_call_is_403(client, node, profile):
    headers = bearer("viewer")
    before = state()
    for method, path in operations():
        if method == "GET":
            response = call(client, method, path, headers)
            # Reading the GPU holders runs on the node: nothing does for a viewer.
            allowed = (403,) if path.endswith("/gpus") else (200, 404, 409)
            assert response.status_code in allowed, (path, response.content)
        elif path != "/api/profiles/validate":
            body = {"node": "gpu-01", "args": FITS, "profile": "kimi", "profiles": []}
            response = call(client, method, path, headers, body)
            assert response.status_code == 403, (method, path, response.content)
    assert state()[:-1] == before[:-1]


def test_an_operator_validates_and_saves_revisions_with_the_budgets_words(client, node, profile):
    headers = bearer("operator")
    checked = call(
        client, "POST", "/api/profiles/validate", headers, {"node": "gpu-01", "args": TOO_BIG}
    )
    assert checked.status_code == 200 and checked.json()["verdict"] == "block"
    assert checked.json()["suggestion"]["--hicache-size"] < 300
    refused = call(
        client, "POST", "/api/profiles/kimi/revisions", headers, {"node": "gpu-01", "args": TOO_BIG}
    )
    assert refused.status_code == 400 and refused.json()["detail"].startswith("block: ")
    saved = call(
        client, "POST", "/api/profiles/kimi/revisions", headers,
        {"node": "gpu-01", "args": FITS, "message": "from CI", "acknowledge_warnings": True},
    )  # fmt: skip
    assert saved.status_code == 201, saved.content
    assert ProfileRevision.objects.filter(profile=profile).count() == 2
    got = client.get("/api/profiles/kimi", **headers).json()
    assert [r["number"] for r in got["revisions"]] == [1, 2]
    assert got["revisions"][0]["stamps"][0]["gpu_count"] == 8
    assert client.get("/api/profiles", **headers).status_code == 200
    assert got["revisions"][0]["env"] == {"HF_TOKEN": "****"}
    bad = call(client, "POST", "/api/profiles/kimi/revisions", headers, {"node": "gpu-01"})
    assert bad.status_code == 422 and "args" in bad.json()["detail"]
    unknown = call(
        client, "POST", "/api/profiles/validate", headers,
        {"node": "gpu-01", "args": ["--model-path", "/m", "--no-such-flag"]},
    )  # fmt: skip
    assert unknown.status_code == 400 and "refuses" in unknown.json()["detail"]


def test_launch_through_the_api_then_read_it_and_its_log(client, node, profile):
    node.host_key = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBdT4JxNkTy/+iculPU8JKSNDmkkoOmX7fwy4pE43/QY"
    )
    node.save()
    headers = bearer("operator")
    made = call(client, "POST", "/api/launches", headers, {"node": "gpu-01", "profile": "kimi@1"})
    assert made.status_code == 202, made.content
    launch = Launch.objects.get()
    assert made.json()["id"] == launch.pk and made.json()["status"] == "pending"
    launch.lines.create(seq=1, text="Load weight begin")
    launch.lines.create(seq=2, text="Load weight end")
    log = client.get(f"/api/launches/{launch.pk}/log?after=1", **headers).json()
    assert log["lines"] == [[2, "Load weight end"]]
    both = call(
        client, "POST", "/api/launches", headers,
        {"node": "gpu-01", "profile": "kimi", "command": "python3 -m sglang.launch_server"},
    )  # fmt: skip
    assert both.status_code == 400
    assert (
        client.get("/api/launches?status=pending", **headers).json()["items"][0]["id"] == launch.pk
    )
    assert client.get("/api/launches?status=nonsense", **headers).status_code == 422


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--nccl-port 0", "--nccl-port 0 is not a TCP port"),
        ("--disaggregation-bootstrap-port 0", "--disaggregation-bootstrap-port 0 is not a TCP"),
        ("--dist-init-addr 127.0.0.1:70000", "port 70000 is not a TCP port"),
        ("--port 65535 --enable-dp-attention --dp-size 2", "beyond 65535"),
        ("'$(id)'", "unrecognized arguments: $(id)"),
        ("--gpus 9", "unrecognized arguments: 9"),
    ],
)
def test_a_pasted_launch_the_parser_refuses_is_400_and_saves_nothing(client, node, flags, message):
    node.host_key = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBdT4JxNkTy/+iculPU8JKSNDmkkoOmX7fwy4pE43/QY"
    )
    node.save()
    command = f"python3 -m sglang.launch_server --model-path /m --tp-size 2 {flags}"
    made = call(
        client, "POST", "/api/launches", bearer("operator"), {"node": "gpu-01", "command": command}
    )
    assert made.status_code == 400, made.content
    assert message in made.json()["detail"] and "override the sglang check" in made.json()["detail"]
    assert not Launch.objects.exists() and not LaunchProfile.objects.exists()
    assert not AuditEntry.objects.filter(action="launch.create").exists()


def test_a_pasted_launch_with_the_sglang_check_overridden_goes_ahead(client, node, settings):
    settings.RANKWISE_MODEL_READ_WAIT_SECONDS = 0  # no worker here: the model is not read
    node.host_key = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBdT4JxNkTy/+iculPU8JKSNDmkkoOmX7fwy4pE43/QY"
    )
    node.save()
    command = "python3 -m sglang.launch_server --model-path /m --tp-size 2 --no-such-flag"
    body = {"node": "gpu-01", "command": command, "overrides": {"sglang": "a custom build"}}
    made = call(client, "POST", "/api/launches", bearer("operator"), body)
    assert made.status_code == 202, made.content
    assert Launch.objects.get().revision.args[-1] == "--no-such-flag"


def test_export_then_import_into_an_empty_database_reproduces_profiles_revisions_stamps(
    node, profile
):
    doc = exchange.export(secrets=True)
    LaunchProfile.objects.all().delete()
    assert not ProfileRevision.objects.exists() and not KnownGoodStamp.objects.exists()
    report = exchange.import_(doc, author="cli")
    assert report.created == ["kimi@1"] and not report.conflicts
    again = exchange.export(secrets=True)
    for exported in (doc, again):
        exported.pop("exported_at")
    # The same, but for where the stamps came from: an imported stamp says so, and stays so.
    (stamp,) = again["profiles"][0]["revisions"][0]["stamps"]
    assert stamp.pop("imported_from").startswith("a document imported by cli (exported ")
    assert again == doc
    assert exchange.import_(doc, author="cli").skipped == ["kimi@1"]
    doc["profiles"][0]["revisions"][0]["args"] = TOO_BIG
    assert exchange.import_(doc, author="cli").conflicts == ["kimi@1"]
    masked = exchange.export()  # secrets as ****, nodes this panel lacks
    LaunchProfile.objects.all().delete()
    masked["profiles"][0]["revisions"][0]["node"] = "elsewhere"
    notes = exchange.import_(masked, author="cli").notes
    assert any("HF_TOKEN came in masked" in n for n in notes)
    assert any("nodes elsewhere are not in this panel" in n for n in notes)


def test_odd_input_is_refused_with_a_reason_not_a_500(client, node, profile):
    headers = bearer("operator")
    nul = call(client, "POST", "/api/profiles/validate", headers, {"node": "gpu\u0000", "args": []})
    assert nul.status_code == 400 and "NUL" in nul.json()["detail"]
    huge = call(
        client, "POST", "/api/launches", headers,
        {"node": "gpu-01", "profile": "kimi", "timeout_s": 2**63},
    )  # fmt: skip
    assert huge.status_code == 422
    again = exchange.export()  # masked, as anyone downloads it
    report = call(client, "POST", "/api/profiles/import", headers, again).json()
    assert report["skipped"] == ["kimi@1"] and not report["conflicts"]
    assert AuditEntry.objects.filter(action="profile.import").exists()


def test_a_viewer_is_refused_a_change_before_its_body_is_read(client, node, profile):
    headers = bearer("viewer")
    for path in ("/api/launches", "/api/profiles/kimi/revisions", "/api/profiles/import"):
        assert call(client, "POST", path, headers, {}).status_code == 403, path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other"}, "not a rankwise-profiles/1 document"),
        (
            {"profiles": [{"name": "x", "revisions": [{"number": 1, "args": ["--bogus"]}]}]},
            "refuses",
        ),
        ({"profiles": [{"name": "x", "revisions": [{"number": 0, "args": []}]}]}, "from 1 to"),
        ({"profiles": [{"name": "x", "revisions": [{"number": 1, "args": [1]}]}]}, "strings"),
        ({"profiles": [{"name": "../etc", "revisions": []}]}, "lower-case letters"),
        ({"profiles": [{"name": "x", "revisions": [{"number": 2**63, "args": []}]}]}, "whole"),
        (
            {
                "profiles": [
                    {
                        "name": "x",
                        "revisions": [{"number": 1, "args": ["--model-path", "/m"], "stamps": 5}],
                    }
                ]
            },
            "stamps must be a list",
        ),
        (
            {
                "profiles": [
                    {"name": "x", "revisions": [{"number": 1, "args": [], "env": {"A B": "1"}}]}
                ]
            },
            "variable names",
        ),
        (
            {
                "profiles": [
                    {
                        "name": "x",
                        "revisions": [
                            {
                                "number": 1,
                                "args": ["--model-path", "/m"],
                                "stamps": [
                                    {
                                        "node": "n",
                                        "gpu_name": "g",
                                        "gpu_count": 1,
                                        "gpu_memory_bytes": 1,
                                        "healthy_seconds": "abc",
                                    }
                                ],
                            }
                        ],
                    }
                ]
            },
            "whole number",
        ),
        (
            # PostgreSQL stores no NUL: refused in words, not a DataError and a 500.
            {
                "profiles": [
                    {
                        "name": "x",
                        "revisions": [{"number": 1, "args": ["--model-path", "/m\x00"]}],
                    }
                ]
            },
            "x@1: args holds a NUL character",
        ),
    ],
)
def test_an_import_that_cannot_be_read_saves_nothing(node, change, message):
    doc = {"format": exchange.FORMAT, "profiles": [], **change}
    with pytest.raises(exchange.ImportRefused, match=message):
        exchange.import_(doc, author="cli")
    assert not LaunchProfile.objects.exists()


def test_the_document_s_visibilities_are_the_profile_model_s():
    literal, _ = get_args(ProfileEntry.model_fields["visibility"].annotation)
    assert set(get_args(literal)) == set(LaunchProfile.Visibility.values)


def test_tokens_are_shown_once_listed_by_prefix_and_revoked(client):
    user = make_user("olga", "operator")
    client.force_login(user)
    page = client.post(reverse("nodes:token-list"), {"name": "CI"}, follow=True).content.decode()
    token = re.search(r'id="new-token">(rw_[^<]+)<', page)[1]
    assert client.get("/api/nodes", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    listed = client.get(reverse("nodes:token-list")).content.decode()  # a reload
    assert token not in listed and token[:10] in listed
    assert ApiToken.objects.count() == 1
    row = ApiToken.objects.get()
    assert row.digest != token and token not in row.digest
    client.post(reverse("nodes:token-revoke", args=[row.pk]))
    assert client.get("/api/nodes", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401
    assert AuditEntry.objects.filter(action__in=["token.create", "token.revoke"]).count() == 2


def test_lists_come_in_pages_that_say_how_many_there_are(client, node, profile):
    revision = profile.revisions.get()
    Launch.objects.bulk_create(
        Launch(
            revision=revision, node=node, gpus=[0], port=30000, created_by="olga",
            startup_timeout_s=60, status="stopped",
        )
        for _ in range(250)
    )  # fmt: skip
    headers = bearer("viewer")
    first = client.get("/api/launches", **headers).json()
    assert first["count"] == 250 and len(first["items"]) == 200  # no longer cut silently at 200
    rest = client.get("/api/launches?offset=200&status=stopped", **headers).json()
    assert rest["count"] == 250 and len(rest["items"]) == 50
    seen = {i["id"] for i in first["items"]} | {i["id"] for i in rest["items"]}
    assert seen == set(Launch.objects.values_list("pk", flat=True))
    page = client.get("/api/launches?limit=10&offset=5", **headers).json()
    assert [i["id"] for i in page["items"]] == [i["id"] for i in first["items"][5:15]]
    for bad in ("limit=0", "limit=1001", "offset=-1", f"offset={2**63}"):
        assert client.get(f"/api/launches?{bad}", **headers).status_code == 422, bad
    assert client.get("/api/nodes", **headers).json()["count"] == 1
    assert [p["name"] for p in client.get("/api/profiles", **headers).json()["items"]] == ["kimi"]
    schema = client.get("/api/openapi.json").json()
    for path in ("/api/launches", "/api/nodes", "/api/profiles"):
        operation = schema["paths"][path]["get"]
        assert {"limit", "offset"} <= {p["name"] for p in operation["parameters"]}, path
        ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        paged = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        assert set(paged["properties"]) == {"items", "count"}, path
