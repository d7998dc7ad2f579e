"""Bad ports and interpreter prefixes are refused where a profile is saved (form, API, import,
pasted launch command), not only when it is launched; nothing is saved."""

from __future__ import annotations

import html
import json

import pytest
from django.urls import reverse

from nodes.domain.units import GB
from nodes.models import Launch, LaunchProfile, ProfileRevision
from nodes.services import tokens
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db
FITS = "--model-path /m --tp-size 8 --enable-hierarchical-cache --hicache-size 37"


@pytest.fixture
def node():
    return make_node(
        "gpu-01",
        sglang_version="0.5.9",
        mem_available_bytes=440 * GB,
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake",
    )


def form(node, **overrides: str) -> dict[str, str]:
    data = {
        "name": "kimi-tp8", "node": str(node.pk), "model_path": "/m", "tp_size": "8",
        "pp_size": "1", "dp_size": "1", "kv_cache_dtype": "auto", "port": "30000",
        "enable_hicache": "on", "hicache_size": "37", "action": "save", "acknowledge": "on",
    }  # fmt: skip
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("extra", "shown"),
    [
        ("--port 70000", "--port 70000 is not a TCP port (1–65535)"),
        ("--port 0", "--port 0 is not a TCP port"),
        ("--nccl-port 70000", "--nccl-port 70000 is not a TCP port"),
        ("--nccl-port=-1", "--nccl-port -1 is not a TCP port"),
    ],
)
def test_the_form_refuses_a_port_in_its_extra_flags(operator_client, node, extra, shown):
    response = operator_client.post(reverse("nodes:profile-create"), form(node, extra_flags=extra))
    assert response.status_code == 200
    assert shown in response.content.decode()
    assert not ProfileRevision.objects.exists() and not LaunchProfile.objects.exists()
    # The same profile with a real port saves: the port was the only problem.
    saved = operator_client.post(
        reverse("nodes:profile-create"), form(node, extra_flags="--nccl-port 29500")
    )
    assert saved.status_code == 302 and ProfileRevision.objects.count() == 1


def test_loading_a_pasted_command_with_c_says_why_and_fills_nothing(operator_client, node):
    pasted = "python3 '-cimport os;os.system(\"id\")' -m sglang.launch_server --model-path /evil"
    response = operator_client.post(
        reverse("nodes:profile-create"),
        {"name": "x", "node": node.pk, "pasted_command": pasted, "action": "load"},
    )
    body = response.content.decode()
    assert "the interpreter option -c" in body and "runs the code given after it" in body
    assert 'value="/evil"' not in body  # no field was filled from it
    assert not ProfileRevision.objects.exists()


@pytest.mark.parametrize(
    ("pasted", "said"),
    [
        (
            "cd /opt && sudo python3 -m sglang.launch_server --model-path /m --tp-size 2",
            "“cd /opt && sudo” before the launcher would not be run",
        ),
        ("sudo sglang serve --model-path /m", "“sudo” before the launcher would not be run"),
    ],
)
def test_loading_a_command_with_a_shell_prefix_says_so_plainly_and_nothing_else(
    operator_client, node, pasted, said
):
    response = operator_client.post(
        reverse("nodes:profile-create"),
        {"node": node.pk, "pasted_command": pasted, "action": "load"},
    )
    body = html.unescape(response.content.decode())
    assert said in body, body
    assert "sudo is not needed" in body
    # Only the paste is in question: the empty name is not called missing before a save.
    assert "This field is required" not in body
    assert not ProfileRevision.objects.exists()


@pytest.mark.parametrize(
    "pasted",
    [
        "python3 '-cimport os;os.system(\"id\")' -m sglang.launch_server --model-path /m",
        "python3 -W ignore::antigravity.x -m sglang.launch_server --model-path /m",
    ],
)
def test_a_pasted_launch_command_with_interpreter_code_is_refused(operator_client, node, pasted):
    response = operator_client.post(
        reverse("nodes:launch-create"), {"node": node.pk, "command": pasted}
    )
    assert response.status_code == 200 and "is refused" in response.content.decode()
    assert not Launch.objects.exists() and not LaunchProfile.objects.exists()


def bearer(role: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(make_user(role, role), 'test')}"}


def post(client, path: str, body: object, headers: dict[str, str]):
    return client.post(path, json.dumps(body), content_type="application/json", **headers)


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_the_api_refuses_a_bad_port_at_save_and_at_validate(client, node, port):
    headers = bearer("operator")
    args = [*FITS.split(), "--port", port]
    for path, body in (
        ("/api/profiles/kimi/revisions", {"node": "gpu-01", "args": args}),
        ("/api/profiles/validate", {"node": "gpu-01", "args": args}),
    ):
        response = post(client, path, {**body, "acknowledge_warnings": True}, headers)
        assert response.status_code == 400, response.content
        assert f"--port {port} is not a TCP port" in response.json()["detail"]
    assert not ProfileRevision.objects.exists()


def test_an_import_with_a_bad_port_saves_nothing(client, node):
    doc = {
        "format": "rankwise-profiles/1",
        "profiles": [
            {
                "name": "kimi",
                "revisions": [
                    {"number": 1, "args": ["--model-path", "/m"], "sglang_version": "0.5.9"},
                    {"number": 2, "args": ["--model-path", "/m", "--nccl-port", "70000"]},
                ],
            }
        ],
    }
    response = post(client, "/api/profiles/import", doc, bearer("operator"))
    assert response.status_code == 400
    assert "--nccl-port 70000 is not a TCP port" in response.json()["detail"]
    assert not LaunchProfile.objects.exists()
