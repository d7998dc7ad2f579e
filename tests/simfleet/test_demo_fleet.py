"""The demo's fleet (``./run demo`` starts it from ``simfleet/demo.json``): a newcomer can reach
every journey on it, the incident's aftermath included, without ``simfleet hold``."""

from __future__ import annotations

from pathlib import Path

from simfleet.spec import NodeSpec, from_options, load_spec_file

ROOT = Path(__file__).resolve().parents[2]


def demo_nodes() -> list[NodeSpec]:
    entries = load_spec_file(str(ROOT / "simfleet" / "demo.json"))
    return [from_options(f"demo-{i}", entry) for i, entry in enumerate(entries)]


def test_run_demo_starts_the_fleet_the_spec_file_describes():
    assert "--spec simfleet/demo.json" in (ROOT / "run").read_text()


def test_the_demo_has_the_incidents_node_with_its_aftermath():
    nodes = demo_nodes()
    incident_sized = [n for n in nodes if n.gpus == 8 and n.host_ram_bytes == 449 * 10**9]
    assert len(incident_sized) >= 2  # one server over two nodes (--nnodes 2)
    assert any("leak-on-crash" in n.faults for n in incident_sized)
    # The first node, the tour's, starts and stops cleanly.
    assert nodes[0].faults == [] and nodes[0].sglang_version == "0.5.9"
    assert len({n.sglang_version for n in nodes}) >= 2  # clones and placement show a difference
