"""The environment policy and the variable-name rule at every door: the profile form (typed and
pasted), the API, the import, ``save_revision``, the launch; the node's admin allowances."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from nodes.models import AuditEntry, Launch, LaunchProfile, Node, ProfileRevision
from nodes.services import exchange, model_facts, profiles, tokens
from nodes.workflows import launching
from tests.factories import make_node, make_user, node_form_data

pytestmark = pytest.mark.django_db
ATTACK = {
    "PYTHONWARNINGS": "ignore::antigravity.x",
    "BROWSER": "/bin/sh -c 'id > pwned.txt' #%s",
}
ARGS = ["--model-path", "/m", "--tp-size", "1"]


@pytest.fixture
def node():
    return make_node("gpu-01", sglang_version="0.5.9", host_key="ssh-ed25519 AAAAtest")


def form_data(node: Node, env: str) -> dict[str, Any]:
    return {
        "name": "hooked", "node": node.pk, "model_path": "/m", "tp_size": "1", "pp_size": "1",
        "dp_size": "1", "kv_cache_dtype": "auto", "port": "30000", "extra_flags": "",
        "env": env, "model_config": "", "message": "", "action": "save", "acknowledge": "on",
    }  # fmt: skip


def api(client, path: str, body: Any) -> Any:
    user = User.objects.filter(username="op-api").first() or make_user("op-api", "operator")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(user, 'test')}"}
    return client.post(path, data=json.dumps(body), content_type="application/json", **headers)


def export_doc(env: dict[str, str], node: str = "gpu-01") -> dict[str, Any]:
    revision = {"number": 1, "args": ARGS, "env": env, "node": node, "sglang_version": "0.5.9"}
    return {"format": exchange.FORMAT, "profiles": [{"name": "hooked", "revisions": [revision]}]}


def test_the_form_refuses_the_hooks_naming_each_and_saves_nothing(operator_client, node):
    env = "\n".join(f"{k}={v}" for k, v in ATTACK.items())
    response = operator_client.post(reverse("nodes:profile-create"), form_data(node, env))
    body = response.content.decode()
    assert response.status_code == 200
    assert "PYTHONWARNINGS is refused" in body and "BROWSER is refused" in body
    assert "ask an admin to allow" in body
    assert not ProfileRevision.objects.exists()


def test_a_pasted_command_with_the_hooks_is_refused_when_loaded(operator_client, node):
    pasted = "PYTHONWARNINGS=ignore::antigravity.x python3 -m sglang.launch_server --model-path /m"
    data = {**form_data(node, ""), "action": "load", "pasted_command": pasted}
    loaded = operator_client.post(reverse("nodes:profile-create"), data)
    assert "PYTHONWARNINGS is refused" in loaded.content.decode()
    assert not ProfileRevision.objects.exists()


def test_the_api_refuses_the_hooks_when_validating_and_saving(client, node):
    for path in ("/api/profiles/validate", "/api/profiles/hooked/revisions"):
        response = api(client, path, {"node": "gpu-01", "args": ARGS, "env": ATTACK})
        assert response.status_code == 400, response.content
        detail = response.json()["detail"]
        assert "PYTHONWARNINGS is refused" in detail and "BROWSER is refused" in detail
        assert "pwned" not in detail  # values are never echoed
    assert not ProfileRevision.objects.exists()


RERUN_HOOKS = [
    "_PYTHON_SYSCONFIGDATA_NAME", "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND",
    "TRITON_PTXAS_BLACKWELL_PATH", "NCCL_ENV_PLUGIN", "NVCC_PREPEND_FLAGS", "CUDAHOSTCXX",
    "CUDA_HOME", "ZDOTDIR", "NCCL_DEBUG_FILE", "SSLKEYLOGFILE", "PYTHONOPTIMIZE",
]  # fmt: skip


def test_the_hooks_of_the_re_run_are_refused_by_the_api_and_a_pasted_launch(client, node):
    response = api(
        client, "/api/profiles/hooked/revisions",
        {"node": "gpu-01", "args": ARGS, "env": dict.fromkeys(RERUN_HOOKS, "/tmp/x")},
    )  # fmt: skip
    assert response.status_code == 400, response.content
    assert all(f"{name} is refused" in response.json()["detail"] for name in RERUN_HOOKS)
    pasted = "PYTHONOPTIMIZE=2 python3 -m sglang.launch_server --model-path /m"
    with pytest.raises(launching.LaunchInputError, match="PYTHONOPTIMIZE is refused"):
        launching.submit(node=node, actor=make_user("olga", "operator"), command=pasted)
    assert not ProfileRevision.objects.exists() and not Launch.objects.exists()


def test_the_import_refuses_the_hooks_and_saves_nothing(node):
    with pytest.raises(exchange.ImportRefused, match="hooked@1: BROWSER is refused"):
        exchange.import_(export_doc(ATTACK), author="cli")
    with pytest.raises(exchange.ImportRefused, match="LD_PRELOAD is refused"):
        exchange.import_(export_doc({"LD_PRELOAD": "/x.so"}, node="elsewhere"), author="cli")
    assert not LaunchProfile.objects.exists()


def test_save_revision_itself_refuses_them_for_any_caller(node):
    """The door a script or the ``profile save`` command goes through."""
    model = model_facts.ModelFacts(None, None, "test")
    report = profiles.evaluate(ARGS, node, model)
    with pytest.raises(profiles.EnvRefused, match="LD_PRELOAD is refused"):
        profiles.save_revision(
            profile_name="hooked", args=ARGS, env={"LD_PRELOAD": "/x.so"}, message="",
            node=node, report=report, model=model, actor=make_user("s", "operator"),
        )  # fmt: skip
    assert not ProfileRevision.objects.exists()


def test_a_revision_stored_before_the_policy_is_refused_at_launch(node):
    profile = LaunchProfile.objects.create(name="old", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=ARGS, env=ATTACK, node=node, verdict="ok", report={}
    )
    with pytest.raises(launching.LaunchInputError) as refused:
        launching.submit(node=node, revision=revision, actor=make_user("olga", "operator"))
    assert "BROWSER is refused" in str(refused.value)
    assert "PYTHONWARNINGS is refused" in str(refused.value)
    assert not Launch.objects.exists()


def test_a_pasted_launch_command_with_a_hook_is_refused_and_keeps_nothing(node):
    command = "LD_PRELOAD=/tmp/x.so python3 -m sglang.launch_server --model-path /m"
    with pytest.raises(launching.LaunchInputError, match="LD_PRELOAD is refused"):
        launching.submit(node=node, command=command, actor=make_user("olga", "operator"))
    assert not Launch.objects.exists() and not LaunchProfile.objects.exists()


def test_an_admin_allowance_on_the_node_lets_a_variable_through_there_only(operator_client, node):
    node.allowed_env = ["LD_LIBRARY_PATH"]
    node.save()
    other = make_node("gpu-02", sglang_version="0.5.9")
    env = "LD_LIBRARY_PATH=/opt/cuda/lib64"
    operator_client.post(reverse("nodes:profile-create"), form_data(node, env))
    assert ProfileRevision.objects.get().env == {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}
    response = operator_client.post(
        reverse("nodes:profile-create"), {**form_data(other, env), "name": "other"}
    )
    assert "LD_LIBRARY_PATH is refused" in response.content.decode()
    assert "on node gpu-02" in response.content.decode()
    assert ProfileRevision.objects.count() == 1


# --- one name rule at every door ----------------------------------------------------------


def test_the_form_refuses_a_non_ascii_name(operator_client, node):
    response = operator_client.post(reverse("nodes:profile-create"), form_data(node, "ÄÖ=1"))
    assert "is not an environment variable name" in response.content.decode()
    assert not ProfileRevision.objects.exists()


def test_the_form_refuses_a_non_ascii_name_in_a_pasted_command(operator_client, node):
    pasted = "ÄÖ=1 python3 -m sglang.launch_server --model-path /m"
    data = {**form_data(node, ""), "action": "load", "pasted_command": pasted}
    response = operator_client.post(reverse("nodes:profile-create"), data)
    assert "is not an environment variable name" in response.content.decode()


@pytest.mark.parametrize("name", ["ÄÖ", "A-B", "1A", "A" * 129])
def test_the_api_refuses_a_bad_name(client, node, name):
    response = api(client, "/api/profiles/named/revisions", {"node": "gpu-01", "args": ARGS,
                                                            "env": {name: "1"}})  # fmt: skip
    assert response.status_code == 400
    assert "is not an environment variable name" in response.json()["detail"]


def test_the_import_refuses_a_non_ascii_name(node):
    with pytest.raises(exchange.ImportRefused, match="is not an environment variable name"):
        exchange.import_(export_doc({"ÄÖ": "1"}), author="cli")


def test_a_pasted_launch_command_refuses_a_non_ascii_name(node):
    with pytest.raises(launching.LaunchInputError, match="is not an environment variable name"):
        launching.submit(
            node=node, command="ÄÖ=1 python3 -m sglang.launch_server --model-path /m",
            actor=make_user("olga", "operator"),
        )  # fmt: skip


# --- the node's settings --------------------------------------------------------------------


def test_an_admin_sets_allowances_and_the_run_as_user_audited_and_shown(admin_client_):
    node = make_node("gpu-01")
    data = node_form_data(allowed_env_text="LD_LIBRARY_PATH, NCCL_*", run_as_user="sglang")
    response = admin_client_.post(reverse("nodes:node-edit", args=[node.pk]), data)
    assert response.status_code == 302, response.content.decode()
    node.refresh_from_db()
    assert node.allowed_env == ["LD_LIBRARY_PATH", "NCCL_*"] and node.run_as_user == "sglang"
    entry = AuditEntry.objects.get(action="node.update")
    assert entry.before["allowed_env"] == [] and entry.before["run_as_user"] is None
    assert entry.after["allowed_env"] == ["LD_LIBRARY_PATH", "NCCL_*"]
    assert entry.after["run_as_user"] == "sglang"
    page = admin_client_.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert "Servers run as" in page and ">sglang<" in page and "NCCL_*" in page


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("allowed_env_text", "ÄÖ", "is not a variable name"),
        ("run_as_user", "Bad User", "is not a valid user name"),
        ("run_as_user", "x;id", "is not a valid user name"),
    ],
)
def test_bad_node_settings_are_field_errors(admin_client_, field, value, message):
    node = make_node("gpu-01")
    response = admin_client_.post(
        reverse("nodes:node-edit", args=[node.pk]), node_form_data(**{field: value})
    )
    assert response.status_code == 200 and message in response.content.decode()
    assert not AuditEntry.objects.filter(action="node.update").exists()


def test_the_node_page_says_servers_run_as_the_ssh_user_by_default(viewer_client):
    node = make_node("gpu-01", ssh_user="root")
    page = viewer_client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert ">root<" in page and "(the SSH user; an admin can name an unprivileged user" in page


def test_operators_cannot_edit_node_allowances(operator_client):
    node = make_node("gpu-01")
    response = operator_client.post(
        reverse("nodes:node-edit", args=[node.pk]), node_form_data(allowed_env_text="LD_PRELOAD")
    )
    assert response.status_code == 403
    node.refresh_from_db()
    assert node.allowed_env == []


def test_a_value_too_long_for_execve_is_refused_at_the_api_and_the_import(client, node):
    """Found by an adversarial pass: a 2 MB value saved as ``ok`` and could never launch (exit
    127, "Argument list too long"). Linux takes one variable of at most 128 KiB (its name and
    ``=`` included), and all of them within ARG_MAX."""
    huge = {"MY_SETTING": "x" * 2_000_000}
    response = api(client, "/api/profiles/validate", {"node": "gpu-01", "args": ARGS, "env": huge})
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert "MY_SETTING is refused: its value is 2,000,000 bytes" in detail
    assert "at most 131,060" in detail and "xxxx" not in detail
    with pytest.raises(exchange.ImportRefused, match="MY_SETTING is refused: its value is"):
        exchange.import_(export_doc(huge), author="cli")
    many = {f"MY_SETTING_{i}": "x" * 100_000 for i in range(12)}
    response = api(client, "/api/profiles/validate", {"node": "gpu-01", "args": ARGS, "env": many})
    assert response.status_code == 400
    total = sum(len(f"{k}={v}") + 1 for k, v in many.items())  # each string and its NUL
    assert f"the environment is {total:,} bytes in all" in response.json()["detail"]
    fits = {"MY_SETTING": "x" * 100_000}
    response = api(client, "/api/profiles/validate", {"node": "gpu-01", "args": ARGS, "env": fits})
    assert response.status_code == 200, response.content
    assert not ProfileRevision.objects.exists() and not LaunchProfile.objects.exists()
