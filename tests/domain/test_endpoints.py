"""Where a running server answers, from the panel's network and through an SSH tunnel."""

from __future__ import annotations

from nodes.domain.endpoints import endpoint


def test_a_loopback_server_is_reached_only_through_the_tunnel():
    found = endpoint(None, "10.0.0.5", 30000, 22, "root")
    assert found.direct is None
    assert found.tunnel == "ssh -N -p 22 -L 30000:127.0.0.1:30000 root@10.0.0.5"
    assert found.through_tunnel == "http://127.0.0.1:30000"


def test_a_server_on_every_address_is_reached_at_the_node():
    assert endpoint("0.0.0.0", "gpu-01.lab", 30100, 2222, "ops").direct == "http://gpu-01.lab:30100"
    assert endpoint("10.1.2.3", "gpu-01", 8000, 22, "ops").direct == "http://10.1.2.3:8000"
    assert endpoint("::", "fd00::5", 8000, 22, "ops").direct == "http://[fd00::5]:8000"


def test_an_odd_user_name_is_quoted_in_the_tunnel_command():
    assert endpoint(None, "n", 1, 22, "a b").tunnel.endswith("'a b@n'")
