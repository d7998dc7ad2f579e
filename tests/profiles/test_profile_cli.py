"""``manage.py profile save|show``, run as a script runs it: the form's checks, budget and audit;
exit 0 saved, 1 blocked by the budget, 2 refused input (reason on stderr); secrets masked."""

from __future__ import annotations

import json
import subprocess

import pytest

from nodes.domain.units import GB
from nodes.models import AuditEntry, LaunchProfile, ProfileRevision
from tests.conftest import manage_in_process, manage_py
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db(transaction=True)
SERVER = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi", "--tp-size", "8"]
INCIDENT = [*SERVER, "--enable-hierarchical-cache", "--hicache-size", "300"]
WARNS = [*SERVER, "--enable-hierarchical-cache", "--hicache-size", "37"]  # 296 GB of 449 pinned
SHOW_KEYS = {"name", "number", "node", "args", "env", "verdict"}


@pytest.fixture
def manage(settings):
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") and ":memory:" in str(
        settings.DATABASES["default"]["NAME"]
    ):
        pytest.skip("needs a file-backed test database (set by tests/conftest.py)")

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return manage_py(settings, *args, env=env)

    return run


@pytest.fixture
def refuse():
    """The same entry point in this process, for refused input: a process of its own shows
    nothing more there (the tests that save and show run real processes)."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return manage_in_process(*args, env=env)

    return run


@pytest.fixture
def node():
    # The incident's node: 8 × H200, 449 GB of RAM.
    return make_node(
        "gpu-01", host_ram_bytes=449 * GB, mem_available_bytes=408 * GB, sglang_version="0.5.9"
    )


def save(manage, *args: str, command: list[str], **env: str):
    return manage("profile", "save", *args, "--", *command, **env)


def test_an_ok_profile_is_saved_audited_and_shown(manage):
    make_node("big", host_ram_bytes=2000 * GB, mem_available_bytes=1900 * GB,
              sglang_version="0.5.23")  # fmt: skip
    done = save(manage, "kimi", "--node", "big", "--message", "from CI", command=WARNS)
    assert done.returncode == 0, done.stderr
    assert "Saved kimi@1 (ok) on big" in done.stdout
    revision = ProfileRevision.objects.get()
    assert revision.args == WARNS[3:] and revision.message == "from CI"
    assert revision.verdict == "ok" and revision.node.name == "big"
    entry = AuditEntry.objects.get(action="profile.revision")
    assert entry.actor_name == "cli" and entry.after["revision"] == 1
    again = save(manage, "kimi", "--node", "big", command=[*WARNS, "--port", "30001"])
    assert again.returncode == 0 and ProfileRevision.objects.count() == 2  # the next revision


def test_a_warned_profile_is_saved_with_its_warnings_printed(manage, node):
    done = save(manage, "kimi", "--node", "gpu-01", command=WARNS)
    assert done.returncode == 0, done.stderr
    assert "Verdict: WARN" in done.stdout and "[warn]" in done.stdout
    assert "of host RAM would be pinned" in done.stdout
    assert ProfileRevision.objects.get().verdict == "warn"


def test_the_incident_is_blocked_with_exit_1_and_nothing_saved(manage, node):
    done = save(manage, "kimi", "--node", "gpu-01", command=INCIDENT)
    assert done.returncode == 1
    assert "Verdict: BLOCK" in done.stdout and "suggested: --hicache-size 37" in done.stdout
    assert "not saved: blocked on gpu-01" in done.stderr
    as_json = save(manage, "kimi", "--node", "gpu-01", "--json", command=INCIDENT)
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["refused"] == "block" and doc["verdict"] == "block"
    assert doc["suggestion"] == {"--hicache-size": 37}
    assert any(m["code"] == "host_oom" for m in doc["messages"])
    assert not LaunchProfile.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("args", "command", "reason"),
    [
        (["--node", "gpu-01"], [*SERVER, "--port", "70000"], "--port 70000 is not a TCP port"),
        (["--node", "gpu-01"], [*SERVER, "--nccl-port", "0"], "--nccl-port 0 is not a TCP port"),
        (["--node", "nowhere"], SERVER, "no node named 'nowhere'"),
        (["--node", "gpu-01", "--env", "ÄÖ=1"], SERVER, "'ÄÖ' is not an environment variable name"),
        (["--node", "gpu-01", "--env", "1A=x"], SERVER, "'1A' is not an environment variable name"),
        (["--node", "gpu-01", "--env", "NOVALUE"], SERVER, "expected NAME=VALUE"),
        (["--node", "gpu-01"], ["python3", "-cimport os", *SERVER[1:]], "option -c"),
        (["--node", "gpu-01"], ["sudo", *SERVER], "would not be run"),
        (["--node", "gpu-01"], [*SERVER, "--no-such-flag"], "--no-such-flag is not a flag"),
        (["--node", "gpu-01"], [], "give the launch command after --"),
    ],
)
def test_refused_input_exits_2_with_the_reason_on_stderr(refuse, node, args, command, reason):
    done = save(refuse, "kimi", *args, "--json", command=command)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert reason in done.stderr and done.stderr.count("\n") == 1
    assert json.loads(done.stdout) == {"refused": "input", "reason": done.stderr.strip()}
    assert not ProfileRevision.objects.exists() and not AuditEntry.objects.exists()


def test_a_viewer_cannot_save(refuse, node):
    make_user("vera", "viewer")
    done = save(refuse, "kimi", "--node", "gpu-01", "--actor", "vera", command=WARNS)
    assert done.returncode == 2 and "lacks the operator role" in done.stderr
    assert done.stdout == ""  # without --json, only the reason, on stderr
    assert not ProfileRevision.objects.exists()


def test_json_save_and_show_have_the_contracts_keys_with_secrets_masked(manage, node):
    command = ["HF_TOKEN=hf_secret", *WARNS, "--api-key", "sk-123456"]
    saved = save(
        manage, "kimi", "--node", "gpu-01", "--env", "MY_PASSWORD=hunter22", "--env",
        "NCCL_DEBUG=INFO", "--json", command=command,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    doc = json.loads(saved.stdout)
    assert set(doc) == SHOW_KEYS | {"messages"}
    assert doc["verdict"] == "warn" and any(m["level"] == "warn" for m in doc["messages"])
    stored = ProfileRevision.objects.get()
    assert stored.env == {"HF_TOKEN": "hf_secret", "MY_PASSWORD": "hunter22", "NCCL_DEBUG": "INFO"}
    assert stored.args[-1] == "sk-123456"  # saved as given, masked when shown

    shown = manage("profile", "show", "kimi@1", "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert set(doc) == SHOW_KEYS
    assert doc["name"] == "kimi" and doc["number"] == 1 and doc["node"] == "gpu-01"
    assert doc["args"] == [*WARNS[3:], "--api-key", "****"]
    assert doc["env"] == {"HF_TOKEN": "****", "MY_PASSWORD": "****", "NCCL_DEBUG": "INFO"}
    assert doc["verdict"] == "warn"
    for secret in ("hf_secret", "hunter22", "sk-123456"):
        assert secret not in shown.stdout + saved.stdout
    plain = manage("profile", "show", "kimi")
    assert plain.returncode == 0 and "kimi@1" in plain.stdout and "sk-123456" not in plain.stdout


@pytest.mark.parametrize(
    ("spec", "reason"),
    [("nothing", "no profile named 'nothing'"), ("kimi@9", "has no revision 9"),
     ("kimi@x", "must be a number")],
)  # fmt: skip
def test_show_of_what_does_not_exist_exits_2(refuse, node, spec, reason):
    assert save(refuse, "kimi", "--node", "gpu-01", command=WARNS).returncode == 0
    shown = refuse("profile", "show", spec, "--json")
    assert shown.returncode == 2 and reason in shown.stderr
