from __future__ import annotations

import pytest
from django.urls import reverse

from nodes.domain.units import GB, GiB
from nodes.models import AuditEntry, Gpu, Node
from tests.factories import make_node, node_form_data

pytestmark = pytest.mark.django_db


def _mutations(node: Node) -> list[tuple[str, str, dict]]:
    """Every mutating request the node views accept, with a payload that would succeed."""
    return [
        ("get", reverse("nodes:node-create"), {}),
        ("post", reverse("nodes:node-create"), node_form_data(name="new-node")),
        ("get", reverse("nodes:node-edit", args=[node.pk]), {}),
        ("post", reverse("nodes:node-edit", args=[node.pk]), node_form_data(name="renamed")),
        ("post", reverse("nodes:node-delete", args=[node.pk]), {}),
    ]


def _state() -> list:
    return [
        list(Node.objects.values_list("name", "host", "host_ram_bytes")),
        list(Gpu.objects.values_list("node__name", "index", "memory_total_bytes")),
    ]


@pytest.mark.parametrize("role_client", ["viewer_client", "operator_client"])
def test_non_admins_get_403_from_every_node_mutation_and_nothing_changes(role_client, request):
    client = request.getfixturevalue(role_client)
    node = make_node()
    before = _state()
    audit_before = AuditEntry.objects.filter(action__startswith="node.").count()
    for method, url, data in _mutations(node):
        response = getattr(client, method)(url, data)
        assert response.status_code == 403, (method, url)
        assert "role" in response.content.decode()
    assert _state() == before
    assert AuditEntry.objects.filter(action__startswith="node.").count() == audit_before


def test_anonymous_users_are_sent_to_login(client):
    node = make_node()
    for method, url, data in _mutations(node):
        response = getattr(client, method)(url, data)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    assert Node.objects.get().name == "gpu-01"


def test_viewer_sees_list_and_detail_without_change_buttons(viewer_client):
    node = make_node()
    page = viewer_client.get(reverse("nodes:node-list")).content.decode()
    assert "8 × NVIDIA H200 · 96 GiB" in page
    assert "449 GB" in page
    assert "Add node" not in page
    detail = viewer_client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert "Edit" not in detail and "Delete" not in detail


def test_admin_adds_a_node_and_sees_it_listed(admin_client_):
    response = admin_client_.post(reverse("nodes:node-create"), node_form_data())
    node = Node.objects.get(name="gpu-01")
    assert response.status_code == 302
    assert response["Location"] == reverse("nodes:node-detail", args=[node.pk])
    assert node.host_ram_bytes == 449 * GB
    assert [g.memory_total_bytes for g in node.gpus.all()] == [96 * GiB] * 8
    assert node.labels == ["rack=a3", "h200"]
    listing = admin_client_.get(reverse("nodes:node-list")).content.decode()
    assert "gpu-01" in listing and "8 × NVIDIA H200 · 96 GiB" in listing


@pytest.mark.parametrize(("unit", "expected"), [("GiB", 96 * 2**30), ("GB", 96 * 10**9)])
def test_gpu_memory_unit_is_honoured(admin_client_, unit, expected):
    admin_client_.post(reverse("nodes:node-create"), node_form_data(gpu_memory_1=unit))
    assert set(Gpu.objects.values_list("memory_total_bytes", flat=True)) == {expected}


def test_htmx_post_success_answers_with_client_redirect(admin_client_):
    response = admin_client_.post(
        reverse("nodes:node-create"), node_form_data(), headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("nodes:node-detail", args=[Node.objects.get().pk])


def test_htmx_invalid_post_returns_only_the_form_fragment(admin_client_):
    response = admin_client_.post(
        reverse("nodes:node-create"),
        node_form_data(gpu_memory_0="-96"),
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body and 'id="node-form"' in body
    assert "greater than or equal to 0" in body


BAD_INPUTS = [
    ({"gpu_memory_0": "-96"}, "gpu_memory", "greater than or equal to 0"),
    ({"gpu_memory_0": "96000", "gpu_memory_1": "GiB"}, "gpu_memory", "outside the plausible"),
    ({"gpu_memory_0": "0.1"}, "gpu_memory", "outside the plausible"),
    ({"gpu_memory_0": "lots"}, "gpu_memory", "Enter a number"),
    ({"gpu_memory_1": "Gb"}, "gpu_memory", "Select a valid choice"),
    ({"host_ram_0": "9999999", "host_ram_1": "GB"}, "host_ram", "outside the plausible"),
    ({"host_ram_0": "-1"}, "host_ram", "greater than or equal to 0"),
    ({"gpu_count": "-1"}, "gpu_count", "greater than or equal to 0"),
    ({"gpu_count": "65"}, "gpu_count", "less than or equal to 64"),
    ({"gpu_count": "1e1"}, "gpu_count", "Enter a whole number"),
    ({"gpu_count": "٩"}, "gpu_count", "Enter a whole number"),
    ({"gpu_memory_0": "1e3"}, "gpu_memory", "Enter a number such as 96"),
    ({"gpu_memory_0": "1_000"}, "gpu_memory", "Enter a number such as 96"),
    ({"gpu_memory_1": ""}, "gpu_memory", "Choose GB or GiB."),
    ({"gpu_count": "0"}, "gpu_count", "give the GPU count too"),
    ({"host": "fe80::1%$(id)"}, "host", "no zone ids"),
    ({"sglang_python": "python3; rm -rf /"}, "sglang_python", "no spaces"),
    ({"sglang_python": "venv/bin/python"}, "sglang_python", "absolute path"),
    ({"gpu_memory_0": ""}, "gpu_memory", "Give the memory of each GPU"),
    ({"gpu_name": ""}, "gpu_name", "Name the GPU model"),
    ({"host": "bad host"}, "host", "not a valid host name"),
    ({"host": "a;rm -rf /"}, "host", "not a valid host name"),
    ({"host": "-oProxyCommand=sh"}, "host", "not a valid host name"),
    ({"port": "0"}, "port", "1 to 65535"),
    ({"port": "70000"}, "port", "1 to 65535"),
    ({"ssh_user": "Root user"}, "ssh_user", "not a valid user name"),
    ({"name": "GPU 01"}, "name", "lower-case"),
    ({"sglang_python": "-c"}, "sglang_python", "cannot start with"),
    ({"labels_text": "ok, not ok"}, "labels_text", "is not a label"),
]


@pytest.mark.parametrize(("overrides", "field", "message"), BAD_INPUTS)
def test_bad_input_is_refused_with_a_field_message_and_nothing_saved(
    admin_client_, overrides, field, message
):
    response = admin_client_.post(reverse("nodes:node-create"), node_form_data(**overrides))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field])
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not Node.objects.exists() and not Gpu.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="node.").exists()


def test_duplicate_name_is_refused(admin_client_):
    make_node("gpu-01")
    response = admin_client_.post(reverse("nodes:node-create"), node_form_data(name="gpu-01"))
    assert "already exists" in " ".join(response.context["form"].errors["name"])
    assert Node.objects.count() == 1


def test_edit_form_is_prefilled_so_an_unchanged_save_keeps_the_bytes(admin_client_):
    node = make_node(host_ram_bytes=449 * GB, host="gpu-01.example.net", labels=["rack=a3", "h200"])
    page = admin_client_.get(reverse("nodes:node-edit", args=[node.pk])).content.decode()
    assert 'name="host_ram_0" value="449"' in page
    assert '<option value="GB" selected>' in page
    assert 'name="gpu_memory_0" value="96"' in page
    admin_client_.post(reverse("nodes:node-edit", args=[node.pk]), node_form_data())
    node.refresh_from_db()
    assert node.host_ram_bytes == 449 * GB
    assert {g.memory_total_bytes for g in node.gpus.all()} == {96 * GiB}
    # Nothing changed, so nothing is recorded.
    assert not AuditEntry.objects.filter(action="node.update").exists()


def test_a_discovered_size_reads_rounded_and_an_unchanged_save_keeps_its_bytes(admin_client_):
    # MemTotal as discovery read it on the incident's node: not a round number of GB.
    node = make_node(
        host_ram_bytes=448_999_999_488, host="gpu-01.example.net", labels=["rack=a3", "h200"]
    )
    Gpu.objects.filter(node=node).update(memory_total_bytes=150_754_820_096)  # 143,771 MiB
    page = admin_client_.get(reverse("nodes:node-edit", args=[node.pk])).content.decode()
    assert 'name="host_ram_0" value="449"' in page, page
    assert 'name="gpu_memory_0" value="150.75"' in page
    admin_client_.post(
        reverse("nodes:node-edit", args=[node.pk]),
        node_form_data(gpu_memory_0="150.75", gpu_memory_1="GB"),
    )
    node.refresh_from_db()
    assert node.host_ram_bytes == 448_999_999_488
    assert {g.memory_total_bytes for g in node.gpus.all()} == {150_754_820_096}
    assert not AuditEntry.objects.filter(action="node.update").exists()
    # A size the admin does change is what they typed.
    admin_client_.post(reverse("nodes:node-edit", args=[node.pk]), node_form_data(host_ram_0="450"))
    node.refresh_from_db()
    assert node.host_ram_bytes == 450 * GB


def test_editing_a_mixed_node_without_touching_gpus_keeps_them(admin_client_):
    node = make_node(gpus=1, host="gpu-01.example.net")
    Gpu.objects.create(node=node, index=1, name="NVIDIA A100", memory_total_bytes=80 * GiB)
    node.gpus.filter(index=0).update(uuid="GPU-aaa")
    admin_client_.post(
        reverse("nodes:node-edit", args=[node.pk]),
        node_form_data(gpu_count="2", notes="moved to rack 4"),
    )
    node.refresh_from_db()
    assert node.notes == "moved to rack 4"
    assert node.gpu_summary() == "1 × NVIDIA H200 · 96 GiB + 1 × NVIDIA A100 · 80 GiB"
    assert node.gpus.get(index=0).uuid == "GPU-aaa"


def test_edit_changes_gpus_and_records_before_and_after(admin_client_):
    node = make_node()
    admin_client_.post(
        reverse("nodes:node-edit", args=[node.pk]),
        node_form_data(gpu_count="4", gpu_memory_0="141"),
    )
    assert node.gpus.count() == 4
    entry = AuditEntry.objects.get(action="node.update")
    assert entry.actor_name == "ada"
    assert len(entry.before["gpus"]) == 8 and len(entry.after["gpus"]) == 4
    assert entry.after["gpus"][0]["memory_total_bytes"] == 141 * GiB
    assert entry.request_id


def test_delete_removes_node_and_records_it(admin_client_):
    node = make_node()
    response = admin_client_.post(reverse("nodes:node-delete", args=[node.pk]))
    assert response.status_code == 302
    assert not Node.objects.exists() and not Gpu.objects.exists()
    entry = AuditEntry.objects.get(action="node.delete")
    assert entry.before["name"] == "gpu-01" and entry.after is None


def test_delete_is_post_only(admin_client_):
    node = make_node()
    assert admin_client_.get(reverse("nodes:node-delete", args=[node.pk])).status_code == 405
    assert Node.objects.exists()


def test_node_list_query_count_does_not_grow_with_nodes(admin_client_, django_assert_num_queries):
    for i in range(5):
        make_node(f"gpu-{i:02}")
    # session, user, groups (role), nodes, gpus
    with django_assert_num_queries(5):
        admin_client_.get(reverse("nodes:node-list"))


def test_responses_carry_a_request_id(viewer_client):
    response = viewer_client.get(reverse("nodes:node-list"), headers={"X-Request-ID": "abc-123"})
    assert response["X-Request-ID"] == "abc-123"
    response = viewer_client.get(reverse("nodes:node-list"), headers={"X-Request-ID": "a b\n"})
    assert len(response["X-Request-ID"]) == 32


def test_node_admin_is_read_only_for_support(admin_user):
    from django.test import Client

    admin_user.is_staff = admin_user.is_superuser = True
    admin_user.save()
    client = Client()
    client.force_login(admin_user)
    node = make_node()
    assert client.get(reverse("admin:nodes_node_add")).status_code == 403
    client.post(reverse("admin:nodes_node_change", args=[node.pk]), {"name": "x", "host": "$(id)"})
    node.refresh_from_db()
    assert node.name == "gpu-01" and node.host == "10.0.0.5"
    assert client.get(reverse("admin:nodes_node_change", args=[node.pk])).status_code == 200


def test_request_id_with_trailing_newline_is_replaced_not_echoed(viewer_client):
    response = viewer_client.get(reverse("nodes:node-list"), headers={"X-Request-ID": "abc\n"})
    assert response.status_code == 200 and response["X-Request-ID"] != "abc\n"


def test_audit_filter_ignores_nul_and_odd_characters(viewer_client):
    assert viewer_client.get(reverse("nodes:audit-list"), {"action": "x\x00y"}).status_code == 200
