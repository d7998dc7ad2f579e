"""README is what a newcomer reads first: the two commands, the demo and where to go next, on a
screen or two; the guides it points to exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_quick_start_block_comes_first_with_the_panel_then_the_tests():
    block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert block is not None and README.index("```") == block.start()
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands[:2] == ["./run", "./run test"]


def test_the_demo_is_on_the_first_screen_and_the_readme_stays_short():
    assert "./run demo" in "\n".join(README.splitlines()[:40])
    assert len(README.splitlines()) <= 300


#: A relative link's target: no scheme, no bare anchor (``[x](../.env.example)``, ``(a.md#b)``).
LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s#]+)(?:#[\w-]+)?\)")


def test_every_guide_and_file_it_links_to_exists():
    links = LINK.findall(README)
    assert "docs/launches.md" in links and ".env.example" in links
    assert [link for link in links if not (ROOT / link).exists()] == []
    for guide in (ROOT / "docs").glob("*.md"):
        for link in LINK.findall(guide.read_text()):
            assert (guide.parent / link).exists(), f"{guide.name} links to missing {link}"
