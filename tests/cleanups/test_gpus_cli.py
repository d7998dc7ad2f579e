"""``manage.py gpus`` reads a node live, as the API's ``/nodes/NAME/gpus`` does: an operator's
reading (found by an adversarial pass: a viewer got the live holders the API refuses)."""

from __future__ import annotations

import pytest

from nodes.models import AuditEntry
from tests.conftest import manage_in_process
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db


def test_a_viewer_is_refused_before_anything_is_read():
    make_node("spare")
    make_user("vera", "viewer")
    done = manage_in_process("gpus", "spare", "--json", "--actor", "vera")
    assert done.returncode == 2
    assert done.stderr.strip() == "CommandError: user 'vera' lacks the operator role for this"
    assert done.stdout == ""
    assert not AuditEntry.objects.exists()
