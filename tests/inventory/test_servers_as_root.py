"""Who servers run as is said where it matters: root is refused as the "unprivileged" user, the
node page and the launch form say when servers run as root, and a profile whose flags run code
besides SGLang says so, naming the user (a warning, not a refusal)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from nodes.domain.launch_plan import check_code_on_node
from nodes.models import LaunchProfile, Node, ProfileRevision
from tests.factories import make_node, node_form_data

pytestmark = pytest.mark.django_db


def test_root_is_refused_as_the_unprivileged_user_and_nothing_changes(admin_client_):
    node = make_node(host="gpu-01.example.net", labels=["rack=a3", "h200"])
    url = reverse("nodes:node-edit", args=[node.pk])
    page = admin_client_.post(url, node_form_data(run_as_user="root")).content.decode()
    assert "root is not an unprivileged user" in page
    assert Node.objects.get(pk=node.pk).run_as_user == ""
    admin_client_.post(url, node_form_data(run_as_user="sglang"))
    assert Node.objects.get(pk=node.pk).run_as_user == "sglang"


def test_a_user_the_node_does_not_have_is_refused_at_save(admin_client_):
    """The user servers run as is checked against the users the node's discovery listed
    (before, a typo saved and every launch then failed to start)."""
    node = make_node(host="gpu-01.example.net", facts={"accounts": ["root", "sglang"]})
    url = reverse("nodes:node-edit", args=[node.pk])
    page = admin_client_.post(url, node_form_data(run_as_user="sglnag")).content.decode()
    assert "gpu-01 has no user &#x27;sglnag&#x27;" in page
    assert Node.objects.get(pk=node.pk).run_as_user == ""
    admin_client_.post(url, node_form_data(run_as_user="sglang"))
    assert Node.objects.get(pk=node.pk).run_as_user == "sglang"
    # A node whose users were not listed (discovered before this, or too many) is not judged.
    unlisted = make_node("gpu-02", host="gpu-02.example.net")
    url = reverse("nodes:node-edit", args=[unlisted.pk])
    admin_client_.post(url, node_form_data(name="gpu-02", run_as_user="anyone"))
    assert Node.objects.get(pk=unlisted.pk).run_as_user == "anyone"


def test_the_node_page_and_the_launch_form_say_when_servers_run_as_root(operator_client):
    root = make_node("gpu-01", ssh_user="root")
    make_node("gpu-02", ssh_user="root", run_as_user="sglang")
    page = operator_client.get(reverse("nodes:node-detail", args=[root.pk])).content.decode()
    assert 'id="servers-as-root"' in page and "every right on this node" in page
    form = operator_client.get(reverse("nodes:launch-create")).content.decode()
    assert (
        "Servers run as root on gpu-01:" in form
        and "gpu-02" not in form.split("Servers run as root")[1].split("</")[0]
    )
    other = Node.objects.get(name="gpu-02")
    page = operator_client.get(reverse("nodes:node-detail", args=[other.pk])).content.decode()
    assert 'id="servers-as-root"' not in page


def test_a_profile_that_runs_model_code_says_so_and_as_whom(operator_client):
    node = make_node("gpu-01", ssh_user="root")
    profile = LaunchProfile.objects.create(name="kimi", created_by="pat")
    ProfileRevision.objects.create(
        profile=profile, number=1, author="pat", node=node, verdict="ok", report={}, env={},
        args=["--model-path", "/m", "--trust-remote-code"],
    )  # fmt: skip
    page = operator_client.get(reverse("nodes:profile-detail", args=[profile.pk])).content.decode()
    assert (
        "Runs code besides SGLang: --trust-remote-code runs the Python files shipped in the" in page
    )
    assert "on gpu-01 as root (root: every right on the node)" in page


def test_pre_flight_warns_without_refusing():
    check = check_code_on_node(["--enable-custom-logit-processor", "--tp", "2"], "sglang")
    assert check is not None and check.passed and not check.blocks
    assert "runs code that any request may send" in check.detail and "as sglang" in check.detail
    assert check_code_on_node(["--model-path", "/m"], "root") is None
