"""Launch bundles (rankwise-case/1): downloaded from a launch, read back from folders and
archives, refused when they are not bundles."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from django.urls import reverse

from nodes.domain.bundle import BundleError, exit_of
from nodes.models import Launch, LaunchLogLine, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services import bundles
from nodes.services.bundles import read_bundle
from tests.factories import make_failed, make_node, pool_lines

pytestmark = pytest.mark.django_db
CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
SNAPSHOT = {
    "time": 1764547200.0,
    "meminfo": {"MemTotal": 449_000_000_000, "MemAvailable": 820_000_000},
    "launch": {
        "members": [{"pid": 41, "ppid": 1, "state": "Z", "command": "sglang::scheduler_TP3"}]
    },
    "oom_lines": ["Out of memory: Killed process 41 (sglang::schedul)"],
    "listening_ports": [22],
    "shm_files": [{"name": "nccl-1", "bytes": 4096}],
    "gpus": [
        {
            "index": 0,
            "memory_total_bytes": 96 * 2**30,
            "memory_used_bytes": 90 * 2**30,
            "processes": [{"pid": 40, "name": "python3", "used_memory_bytes": 90 * 2**30}],
        }
    ],
}


@pytest.fixture
def failed_launch():
    node = make_node("gpu-01", sglang_version="0.5.9")
    profile = LaunchProfile.objects.create(name="kimi", created_by="olga")
    revision = ProfileRevision.objects.create(
        profile=profile,
        number=1,
        env={"HF_TOKEN": "hf_secret"},
        author="olga",
        verdict="block",
        args=["--model-path", "/m", "--tp-size", "8", "--api-key", "sk-secret"],
        report={},
    )
    launch = Launch.objects.create(
        revision=revision,
        node=node,
        gpus=list(range(8)),
        port=30000,
        created_by="olga",
        startup_timeout_s=60,
        status=LaunchStatus.FAILED,
        exit_status=-9,
        snapshot=SNAPSHOT,
        reason="sglang::scheduler_TP3 (PID 41) died during start-up",
        last_seq=2,
    )
    LaunchLogLine.objects.bulk_create(
        [
            LaunchLogLine(launch=launch, seq=1, text="Allocating 300.00 GB host memory"),
            LaunchLogLine(launch=launch, seq=2, text="Rank 3 scheduler is dead."),
        ]
    )
    return launch


def test_a_failed_launch_downloads_as_a_bundle_that_reads_back(
    viewer_client, failed_launch, tmp_path
):
    response = viewer_client.get(reverse("nodes:launch-bundle", args=[failed_launch.pk]))
    assert response["Content-Type"] == "application/gzip"
    archive = tmp_path / "launch.tar.gz"
    archive.write_bytes(response.content)
    log, facts = read_bundle(archive)
    assert log == "Allocating 300.00 GB host memory\nRank 3 scheduler is dead.\n"
    assert facts["format"] == "rankwise-case/1" and facts["engine_version"] == "0.5.9"
    assert facts["exit"] == {"code": -9, "signal": "SIGKILL"}
    assert facts["command"][-2:] == ["--api-key", "****"]
    assert facts["env"] == {"HF_TOKEN": "****", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    snapshot = facts["snapshots"][0]
    assert snapshot["phase"] == "after_failure" and snapshot["taken_at"] == "2025-12-01T00:00:00Z"
    assert snapshot["processes"] == [
        {"pid": 41, "ppid": 1, "state": "Z", "cmdline": "sglang::scheduler_TP3"}
    ]
    assert snapshot["gpu_processes"][0]["gpu_index"] == 0
    assert snapshot["kernel_log"] and snapshot["shm"] == {"used_bytes": 4096}
    assert "secret" not in response.content.decode("latin-1")


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_every_corpus_case_reads_as_a_bundle(case):
    log, facts = read_bundle(CASES / case)
    assert log and facts["format"] == "rankwise-case/1"


def make_archive(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"x/launch.log": b"log"}, "needs launch.log and facts.json"),
        ({"launch.log": b"", "facts.json": b"{nope"}, "not JSON"),
        ({"launch.log": b"", "facts.json": b"[]"}, "not a JSON object"),
        (
            {"launch.log": b"", "facts.json": json.dumps({"format": "other/9"}).encode()},
            "not rankwise-case/1",
        ),
        ({"../../etc/launch.log": b"x", "/abs/facts.json": b"{}"}, "in the same folder"),
        ({"a/launch.log": b"", "a/facts.json": b"{}", "b/launch.log": b""}, "more than one"),
        ({"launch.log": b"", "facts.json": b"[" * 100_000}, "nested too deeply"),
        ({"launch.log": b"", "facts.json": b'{"format": NaN}'}, "NaN is not a number"),
        ({f"junk/{i}": b"" for i in range(1001)}, "more than 1000 entries"),
    ],
)
def test_what_is_not_a_bundle_is_refused_with_the_reason(tmp_path, files, message):
    with pytest.raises(BundleError, match=message):
        read_bundle(make_archive(tmp_path / "b.tar.gz", files))
    assert not (tmp_path / "etc").exists()


def test_a_file_that_is_no_archive_is_refused(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(BundleError, match="neither a bundle folder nor a tar archive"):
        read_bundle(junk)


def test_exit_codes_name_their_signal():
    assert exit_of(-9) == {"code": -9, "signal": "SIGKILL"}
    assert exit_of(1) == {"code": 1, "signal": None}
    assert exit_of(None) is None


def test_the_diagnose_command_reads_folders_and_archives(settings, tmp_path):
    from tests.conftest import manage_py

    folder = manage_py(settings, "diagnose", str(CASES / "C05"), "--json")
    assert folder.returncode == 0, folder.stderr
    doc = json.loads(folder.stdout)
    assert set(doc) == {
        "category",
        "secondary_categories",
        "summary",
        "evidence",
        "remedy",
        "numbers",
        "change",
    }
    assert doc["category"] == "host-mem-precheck" and "34.13 GB usable" in doc["summary"]
    # The remedy as flags: the largest --hicache-size per rank that fits (34 GB of 34.13 GB).
    assert doc["change"] == {"--hicache-size": 34}
    files = {f"C09/{p.name}": p.read_bytes() for p in (CASES / "C09").iterdir()}
    archive = manage_py(settings, "diagnose", str(make_archive(tmp_path / "c09.tar.gz", files)))
    assert archive.returncode == 0 and archive.stdout.startswith("mem-fraction-too-low: ")
    refused = manage_py(settings, "diagnose", str(tmp_path / "missing"))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


def test_the_diagnose_command_masks_secrets_its_evidence_quotes(settings, tmp_path):
    from tests.conftest import manage_py

    case = tmp_path / "secret"
    case.mkdir()
    (case / "launch.log").write_text(
        "ValueError: /m contains custom code which must be executed; HF_TOKEN=hf_topsecret "
        "--api-key sk-topsecret\n"
    )
    (case / "facts.json").write_text('{"format": "rankwise-case/1"}')
    for extra in ([], ["--json"]):
        found = manage_py(settings, "diagnose", str(case), *extra)
        assert found.returncode == 0 and "trust-remote-code" in found.stdout, found.stderr
        assert "topsecret" not in found.stdout and "HF_TOKEN=****" in found.stdout


def test_a_bundle_does_not_describe_another_team_s_team_only_process(failed_launch):
    """Anyone who may see a launch downloads its bundle: the processes of another team's
    team-only launch that its cleanup found are said to be one, nothing more."""
    from nodes.models import Cleanup, Team

    team = Team.objects.create(name="alpha")
    other = make_failed(failed_launch.node, ["--model-path", "/m"], [], name="alpha-secret")
    LaunchProfile.objects.filter(pk=other.revision.profile_id).update(
        team=team, visibility=LaunchProfile.Visibility.TEAM
    )
    Cleanup.objects.create(
        node=failed_launch.node, launch=failed_launch, gpus=[0], requested_by="olga",
        status=Cleanup.Status.DONE, message="GPU 0 still held",
        result={"host": {}, "gpus": [{"index": 0, "memory_used_bytes": 10, "holders": [
            {"pid": 934, "command": "sglang::scheduler_TP0 --api-key alpha-key",
             "launch_id": other.pk},
            {"pid": 935, "command": "python3 train.py", "launch_id": None},
        ]}]},
    )  # fmt: skip
    after = bundles.facts_of(failed_launch)["snapshots"][-1]
    names = {p["pid"]: p["name"] for p in after["gpu_processes"]}
    assert names == {934: "a team-only launch's process", 935: "python3 train.py"}


def test_a_host_oom_beside_another_launch_is_diagnosed_naming_it():
    """What the failure snapshot kept of the node's other launches reaches the bundle (in the
    panel's facts and in words) and the diagnosis: their pools and this one's together."""
    node = make_node("gpu-01", sglang_version="0.5.9", host_ram_bytes=449 * 10**9)
    neighbours = [{"label": "#12 (llama@1)", "host_bytes": 420 * 10**9, "pinned": True}]
    snapshot = {**SNAPSHOT, "neighbours": neighbours}
    args = ["--model-path", "/m", "--tp-size", "4", "--enable-hierarchical-cache",
            "--hicache-size", "105"]  # fmt: skip
    launch = make_failed(node, args, pool_lines(105, ranks=4), snapshot=snapshot)
    facts = bundles.facts_of(launch)
    assert facts["extra"]["other_launches_on_node"] == neighbours
    notes = facts["snapshots"][-1]["notes"]
    assert (
        "other launches on the node with host memory committed: #12 (llama@1) 420 GB (pinned)"
        in notes
    )
    assert launch.diagnosis["category"] == "host-oom-hicache"
    assert "420 GB + #12 (llama@1) 420 GB = 840 GB > 449 GB" in launch.diagnosis["summary"]


def test_diagnose_json_survives_facts_of_the_wrong_shape(settings, tmp_path):
    """A facts.json whose meminfo is a list and whose node GPUs a number: still one JSON
    document, exit 0, the category from the log (the change is computed from cleaned facts)."""
    from tests.conftest import manage_py

    facts = json.loads((CASES / "S01" / "facts.json").read_text())
    facts["node"]["gpus"] = 5
    for snapshot in facts["snapshots"]:
        snapshot["meminfo"] = [1, 2]
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "facts.json").write_text(json.dumps(facts))
    (folder / "launch.log").write_text((CASES / "S01" / "launch.log").read_text())
    done = manage_py(settings, "diagnose", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["category"] == "host-oom-hicache" and set(doc["change"]) == {"--hicache-size"}
    # Without MemAvailable, a per-rank size within the node's 449 GB shared by its 8 ranks.
    assert 0 < doc["change"]["--hicache-size"] <= 449 / 8
