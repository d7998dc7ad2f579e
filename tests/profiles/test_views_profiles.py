"""Launch profiles in the panel: blocked profiles are not saved, warnings need acknowledging."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from nodes.domain.units import GB, GiB
from nodes.models import AuditEntry, LaunchProfile, ProfileRevision
from tests.factories import make_node, profile_form_data

pytestmark = pytest.mark.django_db
INCIDENT = (
    "python3 -m sglang.launch_server --model-path /models/kimi --tp-size 8 "
    "--mem-fraction-static 0.93 --enable-hierarchical-cache --hicache-size 300 --trust-remote-code"
)


@pytest.fixture
def node():
    return make_node(
        "gpu-01", host_ram_bytes=449 * GB, mem_available_bytes=408 * GB, sglang_version="0.5.9"
    )


def test_the_incident_is_blocked_shown_with_the_numbers_and_not_saved(operator_client, node):
    response = operator_client.post(reverse("nodes:profile-create"), profile_form_data(node))
    body = response.content.decode()
    assert response.status_code == 200
    assert "Blocked: this node cannot run this profile" in body
    assert "8 × 300 GB = 2400 GB of pinned host memory" in body
    assert "that is 37 GB per rank" in body
    assert "Suggested change: --hicache-size 37 (this check passes it: warn)" in body
    assert not LaunchProfile.objects.exists() and not ProfileRevision.objects.exists()


def test_a_warned_profile_needs_an_acknowledgement_then_saves_revision_1(operator_client, node):
    data = profile_form_data(node, hicache_size="37")
    first = operator_client.post(reverse("nodes:profile-create"), data)
    assert "Read the warnings, then tick this box to save." in first.content.decode()
    assert not ProfileRevision.objects.exists()
    saved = operator_client.post(reverse("nodes:profile-create"), {**data, "acknowledge": "on"})
    assert saved.status_code == 302
    revision = ProfileRevision.objects.get()
    assert revision.number == 1 and revision.verdict == "warn"
    assert revision.args[:4] == ["--model-path", "/models/kimi", "--tp-size", "8"]
    assert "--hicache-size" in revision.args and "37" in revision.args
    entry = AuditEntry.objects.get(action="profile.revision")
    assert entry.request_id == saved["X-Request-ID"] and entry.after["verdict"] == "warn"
    detail = operator_client.get(saved["Location"]).content.decode()
    assert "python3 -m sglang.launch_server --model-path /models/kimi --tp-size 8" in detail


def test_each_save_is_a_new_immutable_revision(operator_client, node):
    data = {**profile_form_data(node, hicache_size="37"), "acknowledge": "on"}
    operator_client.post(reverse("nodes:profile-create"), data)
    profile = LaunchProfile.objects.get()
    operator_client.post(
        reverse("nodes:profile-edit", args=[profile.pk]), {**data, "hicache_size": "30"}
    )
    edit_page = operator_client.get(
        reverse("nodes:profile-edit", args=[profile.pk])
    ).content.decode()
    assert "Memory budget on gpu-01" in edit_page  # the panel is filled from the last revision
    numbers = list(profile.revisions.values_list("number", "args"))
    assert [n for n, _ in numbers] == [2, 1]
    assert "30" in numbers[0][1] and "37" in numbers[1][1]


def test_an_ok_profile_saves_without_acknowledgement(operator_client):
    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.23", gpus=8)
    data = profile_form_data(node, hicache_size="37")
    response = operator_client.post(reverse("nodes:profile-create"), data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert ProfileRevision.objects.get().verdict == "ok"


def test_save_with_a_pasted_command_not_loaded_is_refused_and_saves_nothing(operator_client):
    """The adversarial pass: text in "Start from a command line" and Save revision (not Load)
    saved the form's own fields and dropped the pasted command (its ``-c`` with it)."""
    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.23", gpus=8)
    pasted = "python3 '-cimport os' -m sglang.launch_server --model-path /models/kimi --tp 8"
    data = profile_form_data(node, hicache_size="37", pasted_command=pasted)
    response = operator_client.post(reverse("nodes:profile-create"), data)
    assert response.status_code == 200
    assert "Load the pasted command first (Load pasted command), or clear it" in (
        response.content.decode()
    )
    assert not LaunchProfile.objects.exists() and not ProfileRevision.objects.exists()
    # Cleared, the same form saves.
    saved = operator_client.post(reverse("nodes:profile-create"), {**data, "pasted_command": " "})
    assert saved.status_code == 302 and ProfileRevision.objects.count() == 1


def test_pasting_a_command_fills_the_fields(operator_client, node):
    response = operator_client.post(
        reverse("nodes:profile-create"),
        {
            "name": "kimi",
            "node": node.pk,
            "pasted_command": "HF_TOKEN=x " + INCIDENT,
            "action": "load",
        },
    )
    form = response.context["form"]
    assert form.data["tp_size"] == "8" and form.data["hicache_size"] == "300"
    assert form.data["enable_hicache"] == "on" and form.data["extra_flags"] == "--trust-remote-code"
    assert form.data["env"] == "HF_TOKEN=x"
    assert "2400 GB" in response.content.decode()


def test_the_live_check_returns_only_the_panel_and_keeps_nothing(operator_client, node):
    response = operator_client.post(
        reverse("nodes:profile-check"), profile_form_data(node), headers={"HX-Request": "true"}
    )
    body = response.content.decode()
    assert "<html" not in body and 'id="budget-panel"' in body and "BLOCK" in body
    assert not LaunchProfile.objects.exists()


def test_a_pasted_config_gives_the_device_pool(operator_client, node):
    import json

    from simfleet.models import MODELS

    data = profile_form_data(node, model_config=json.dumps(MODELS["kimi-k2"]["config"]))
    body = operator_client.post(reverse("nodes:profile-check"), data).content.decode()
    assert "KV bytes per token per rank: 70,272" in body and "pasted config.json" in body


def test_viewers_cannot_create_profiles(viewer_client, node):
    assert (
        viewer_client.post(
            reverse("nodes:profile-create"),
            profile_form_data(node, hicache_size="37", acknowledge="on"),
        ).status_code
        == 403
    )
    assert not LaunchProfile.objects.exists()


def test_secrets_are_masked_in_the_shown_command(operator_client):
    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.23")
    data = profile_form_data(
        node, hicache_size="37", extra_flags="--api-key sk-123", env="HF_TOKEN=hf_abc"
    )
    operator_client.post(reverse("nodes:profile-create"), data)
    detail = operator_client.get(
        reverse("nodes:profile-detail", args=[LaunchProfile.objects.get().pk])
    )
    body = detail.content.decode()
    assert "sk-123" not in body and "hf_abc" not in body
    panel = operator_client.post(reverse("nodes:profile-check"), data).content.decode()
    assert "sk-123" not in panel and "hf_abc" not in panel and "HF_TOKEN=****" in panel
    assert "--api-key &#x27;****&#x27;" in body and "HF_TOKEN=****" in body


SECRET_ENV = {
    "MY_PASSWD": "pw-alpha-1",
    "OPENAI_KEY": "oa-bravo-2",
    "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/charlie-3.json",
    "AWS_SECRET_ACCESS_KEY": "aws-delta-4",
    "HF_TOKEN": "hf-echo-5",
}


def test_secret_env_names_are_masked_on_the_page_in_the_audit_and_the_api(
    operator_client, operator
):
    from nodes.services import tokens

    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.23")
    env = "\n".join(f"{k}={v}" for k, v in SECRET_ENV.items()) + "\nTOKENIZERS_PARALLELISM=false"
    flags = "--max-total-tokens 100000 --skip-tokenizer-init --tokenizer-path /models/tok"
    data = profile_form_data(node, hicache_size="37", extra_flags=flags, env=env, acknowledge="on")
    operator_client.post(reverse("nodes:profile-create"), data)
    profile = LaunchProfile.objects.get()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(operator, 'test')}"}
    shown = {
        "page": operator_client.get(reverse("nodes:profile-detail", args=[profile.pk])),
        "api": operator_client.get("/api/profiles", **auth),
        "export": operator_client.get("/api/profiles/export", **auth),
    }
    audit = json.dumps(list(AuditEntry.objects.values("before", "after")), default=str)
    for where, text in [*((k, v.content.decode()) for k, v in shown.items()), ("audit", audit)]:
        assert not [v for v in SECRET_ENV.values() if v in text], where
        # Flags that merely mention tokens keep their values; the harmless variable shows.
        assert "100000" in text and "/models/tok" in text and "false" in text, where
        assert "--skip-tokenizer-init --" in text or '--skip-tokenizer-init"' in text, where


def test_glued_secret_names_and_secrets_inside_flag_values_are_masked_on_the_page_and_api(
    operator_client, operator
):
    from nodes.services import tokens

    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.23")
    env = "PGPASSWORD=pg-foxtrot-6\nGH_TOKENS=gh-golf-7\nMAX_TOKENS=4096"
    flags = (
        "--tool-server http://u:pw-hotel-8@tools:9000 --max-total-tokens 100000 "
        """--model-loader-extra-config '{"password": "india-9"}'"""
    )
    data = profile_form_data(node, hicache_size="37", extra_flags=flags, env=env, acknowledge="on")
    operator_client.post(reverse("nodes:profile-create"), data)
    profile = LaunchProfile.objects.get()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(operator, 'test')}"}
    page = operator_client.get(reverse("nodes:profile-detail", args=[profile.pk])).content.decode()
    api = operator_client.get(f"/api/profiles/{profile.name}", **auth).json()
    for text in (page, json.dumps(api)):
        assert not [s for s in ("pg-foxtrot-6", "gh-golf-7", "pw-hotel-8", "india-9") if s in text]
        assert "100000" in text and "4096" in text  # counts are no secrets
    revision = api["revisions"][0]
    assert revision["env"]["PGPASSWORD"] == "****" and revision["env"]["GH_TOKENS"] == "****"
    assert "http://u:****@tools:9000" in revision["args"]
    assert '{"password": "****"}' in revision["args"]
    assert "http://u:****@tools:9000" in page


SHAPED_SECRETS = {
    "DEPLOY_MATERIAL": "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
    "-----END PRIVATE KEY-----",
    "REPO_MIRROR_CRED": "ghp_" + "k9" * 18,
    "UPSTREAM_HEADER": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcGVyYXRvciJ9.c2lnbmF0dXJlLWp1bGlldA",
    "ALERTS_URL": "https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/lima1234567890mike",
}


def test_secrets_known_by_their_value_are_masked_under_any_name(operator_client, operator):
    from nodes.services import tokens

    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.23")
    env = "\n".join(f"{k}={v}" for k, v in SHAPED_SECRETS.items()) + "\nLOG_LEVEL=debug"
    flags = f"--max-total-tokens 100000 --served-model-name {'ghp_' + 'z8' * 18}"
    data = profile_form_data(node, hicache_size="37", extra_flags=flags, env=env, acknowledge="on")
    operator_client.post(reverse("nodes:profile-create"), data)
    profile = LaunchProfile.objects.get()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(operator, 'test')}"}
    shown = {
        "page": operator_client.get(reverse("nodes:profile-detail", args=[profile.pk])),
        "api": operator_client.get("/api/profiles", **auth),
        "export": operator_client.get("/api/profiles/export", **auth),
    }
    audit = json.dumps(list(AuditEntry.objects.values("before", "after")), default=str)
    for where, text in [*((k, v.content.decode()) for k, v in shown.items()), ("audit", audit)]:
        leaked = [v for v in (*SHAPED_SECRETS.values(), "z8" * 18) if v in text]
        assert not leaked, (where, leaked)
        assert "debug" in text and "100000" in text, where  # the rest still shows
        assert "ALERTS_URL" in text, where  # the name stays: it is what to look for


def test_gpu_memory_matters(operator_client):
    node = make_node("small", host_ram_bytes=449 * GB)
    node.gpus.update(memory_total_bytes=24 * GiB)
    import json

    from simfleet.models import MODELS

    data = profile_form_data(
        node, hicache_size="37", model_config=json.dumps(MODELS["kimi-k2"]["config"])
    )
    body = operator_client.post(reverse("nodes:profile-check"), data).content.decode()
    assert "Device pool not estimated" in body  # no checkpoint size without the node


@pytest.mark.parametrize(
    "config", ["[]", '"x"', "null", "[" * 100000 + "]" * 100000, '{"num_hidden_layers": 1e999}']
)
def test_unusable_pasted_configs_are_reported_not_crashed(operator_client, node, config):
    response = operator_client.post(
        reverse("nodes:profile-check"), profile_form_data(node, model_config=config)
    )
    assert response.status_code == 200
    assert "config.json" in response.content.decode()


def test_editing_keeps_env_values_and_flags_the_form_does_not_offer(operator_client):
    node = make_node("big", host_ram_bytes=2000 * GB, sglang_version="0.5.9")
    data = profile_form_data(
        node,
        hicache_size="37",
        env="EXTRA_ARGS=a b c\nGREETING=it's",
        extra_flags="--kv-cache-dtype fp4_e2m1",
    )
    operator_client.post(reverse("nodes:profile-create"), {**data, "acknowledge": "on"})
    profile = LaunchProfile.objects.get()
    form = operator_client.get(reverse("nodes:profile-edit", args=[profile.pk])).context["form"]
    assert form.initial["env"] == "EXTRA_ARGS=a b c\nGREETING=it's"
    assert "--kv-cache-dtype fp4_e2m1" in form.initial["extra_flags"]


def test_an_absurd_host_pool_is_a_field_error(operator_client, node):
    response = operator_client.post(
        reverse("nodes:profile-create"), profile_form_data(node, hicache_size="9" * 30)
    )
    assert "hicache_size" in response.context["form"].errors


@pytest.fixture
def trusted():
    return make_node(
        "gpu-02", host_ram_bytes=449 * GB, sglang_version="0.5.9", host_key="ssh-ed25519 AAAAx"
    )


def test_the_panel_polls_while_the_model_is_read_and_then_says_none_came(operator_client, trusted):
    url = reverse("nodes:profile-check")
    data = profile_form_data(trusted, model_path="/srv/models/never-read")
    first = operator_client.post(url, data, headers={"HX-Request": "true"}).content.decode()
    assert "reading /srv/models/never-read on gpu-02" in first and "model-reading" in first
    # No worker here: after a minute of polls the panel stops and says so.
    last = operator_client.post(url, {**data, "polls": "150"}).content.decode()
    assert "No worker has read the model in a minute" in last and "model-reading" not in last


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B is not a local path"),
        ("/" + "a" * 2000, "the model path is longer than 1,024 characters"),
    ],
)
def test_a_model_path_the_reader_cannot_take_is_said_in_words(operator, trusted, path, words):
    from django.test import Client

    from nodes.services import tokens

    api = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.create(operator, 't')}")
    answer = api.post(
        "/api/profiles/validate",
        {"node": trusted.name, "args": ["--model-path", path, "--tp-size", "1"]},
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    assert any(words in m["text"] for m in answer.json()["messages"]), answer.json()["messages"]


def test_a_revision_saved_without_its_model_says_so(operator, trusted):
    """The API's save says why the budget went without the model's geometry, as validate
    does (here no worker read it: the save goes on, as for a node that does not answer)."""
    from django.test import Client

    from nodes.services import tokens

    api = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.create(operator, 't')}")
    answer = api.post(
        "/api/profiles/qwen-api/revisions",
        {"node": trusted.name, "args": ["--model-path", "/srv/models/qwen", "--tp-size", "1"]},
        content_type="application/json",
    )
    assert answer.status_code == 201, answer.content
    said = [m for m in answer.json()["messages"] if m["code"] == "model-not-read"]
    assert said and "not read from gpu-02" in said[0]["text"], answer.json()["messages"]


def test_the_live_check_needs_no_name_and_a_new_revision_sends_its_name(operator_client, node):
    """A new revision's name is read-only but sent (a disabled input is not), and a new form
    is checked before it is named."""
    data = {k: v for k, v in profile_form_data(node, hicache_size="37").items() if k != "name"}
    panel = operator_client.post(reverse("nodes:profile-check"), data).content.decode()
    assert "Memory budget on gpu-01" in panel and "Pick a node" not in panel
    saved = {**profile_form_data(node, hicache_size="37"), "acknowledge": "on"}
    operator_client.post(reverse("nodes:profile-create"), saved)
    profile = LaunchProfile.objects.get()
    page = operator_client.get(reverse("nodes:profile-edit", args=[profile.pk])).content.decode()
    name_input = next(tag for tag in page.split("<input") if 'name="name"' in tag)
    assert "readonly" in name_input and "disabled" not in name_input


def test_the_form_suggests_enable_metrics_until_it_is_there(operator_client, node):
    without = operator_client.post(reverse("nodes:profile-check"), profile_form_data(node))
    assert "Add <code>--enable-metrics</code>" in without.content.decode()
    data = profile_form_data(node, extra_flags="--enable-metrics")
    with_it = operator_client.post(reverse("nodes:profile-check"), data)
    assert "Add <code>--enable-metrics</code>" not in with_it.content.decode()


def test_the_budget_offers_removing_hicache_beside_its_suggestion_and_applies_it(
    operator_client, node
):
    """The suggestion states its cost, and removing the feature that forced it is offered:
    one click fills the form without HiCache, keeping the rest; nothing is saved."""
    url = reverse("nodes:profile-create")
    body = operator_client.post(url, profile_form_data(node)).content.decode()
    assert 'id="suggestion-cost"' in body and "device pool tokens is unavailable" in body
    assert "Or remove HiCache (drop --enable-hierarchical-cache and --hicache-size)" in body
    assert 'value="apply-alternative-0"' in body
    assert 'name="enable_hicache" id="id_enable_hicache" checked' in body
    data = {**profile_form_data(node), "action": "apply-alternative-0"}
    applied = operator_client.post(url, data).content.decode()
    assert "Applied the alternative: without --enable-hierarchical-cache" in applied
    assert 'name="enable_hicache" id="id_enable_hicache">' in applied
    assert 'name="mem_fraction_static" value="0.93"' in applied
    assert not ProfileRevision.objects.exists()
    # An alternative that is not offered changes nothing.
    stale = {**profile_form_data(node), "action": "apply-alternative-7"}
    assert "offers no such alternative" in operator_client.post(url, stale).content.decode()


@pytest.mark.parametrize("index", ["²", "9" * 5000, "-1", "abc", ""])
def test_an_alternative_that_is_no_small_number_is_said_not_offered_never_a_500(
    operator_client, node, index
):
    """Found by an attacker: "²" passed ``isdigit()`` and 5,000 digits overflowed ``int()``."""
    data = {**profile_form_data(node), "action": f"apply-alternative-{index}"}
    page = operator_client.post(reverse("nodes:profile-create"), data)
    assert page.status_code == 200
    assert "offers no such alternative" in page.content.decode()


def test_a_new_profile_named_like_another_teams_hidden_one_does_not_say_it_exists(client, node):
    from nodes.models import Team
    from tests.factories import make_user

    alpha = Team.objects.create(name="alpha")
    LaunchProfile.objects.create(
        name="secretx", created_by="ann", team=alpha, visibility=LaunchProfile.Visibility.TEAM
    )
    client.force_login(make_user("bob", "operator"))
    data = {**profile_form_data(node, name="secretx"), "action": "save", "acknowledge": "on"}
    body = client.post(reverse("nodes:profile-create"), data).content.decode()
    assert "that name cannot be used here" in body and "exists" not in body
    assert not ProfileRevision.objects.filter(profile__name="secretx").exists()
