"""``./run`` as a newcomer uses it: it brings the panel up, login works, SIGTERM stops it all."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _group_members(pgid: int) -> list[str]:
    """Live (not zombie) processes in the process group, as "pid stat command" lines."""
    ps = subprocess.run(["ps", "-eo", "pgid=,pid=,stat=,args="], capture_output=True, text=True)
    members = []
    for line in ps.stdout.splitlines():
        group, pid, stat, *args = line.split(None, 3)
        if int(group) == pgid and not stat.startswith("Z"):
            members.append(f"{pid} {stat} {' '.join(args)}")
    return members


def _workers_answering(redis_port: int) -> list[str]:
    """Names (before '@') of the Celery workers that answer a broadcast ping."""
    from celery import Celery

    probe = Celery(broker=f"redis://127.0.0.1:{redis_port}/0", set_as_current=False)
    for _ in range(60):
        replies = probe.control.ping(timeout=1.0)
        names = sorted(name.split("@")[0] for reply in replies for name in reply)
        if len(names) >= 2:
            return names
    return names


def _log_in(base: str, username: str, password: str) -> str:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{base}/login/", timeout=60).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, form[:500]
    data = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": token[1]}
    ).encode()
    return str(opener.open(f"{base}/login/", data=data, timeout=60).read().decode())


def test_run_brings_up_panel_with_its_own_redis_and_stops_on_sigterm(tmp_path):
    web_port, redis_port = _free_port(), _free_port()
    env = {
        # The panel's own settings, as a newcomer's shell has them (not the tests' hasher).
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "RANKWISE_STATE_DIR": str(tmp_path / "state"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'panel.sqlite3'}",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "RANKWISE_PORT": str(web_port),
        "RANKWISE_WORKERS": "1",
        "RANKWISE_STREAM_THREADS": "2",
        # A virtualenv of its own, from requirements.txt alone: a missing runtime dependency
        # shows here even though the test tools' virtualenv happens to have it.
        "RANKWISE_VENV": str(tmp_path / "venv"),
    }
    log = (tmp_path / "run.log").open("w+")
    # A new session stands in for the terminal: the script and its children share its group.
    proc = subprocess.Popen(
        ["./run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 420
        while not _answers(web_port):
            assert proc.poll() is None, (tmp_path / "run.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.5)
        assert _answers(redis_port), "./run should have started Redis on the port in REDIS_URL"

        output = (tmp_path / "run.log").read_text()
        # The first password is in an owner-only file, never in the output (which may go to
        # nohup.out or the journal).
        kept = tmp_path / "state" / "admin_password"
        username, password = kept.read_text().split()
        assert username == "admin" and password not in output and str(kept) in output, output
        assert oct(kept.stat().st_mode & 0o777) == "0o600"
        page = _log_in(f"http://127.0.0.1:{web_port}", "admin", password)
        assert "<h1>Nodes</h1>" in page and "admin · Admin" in page
        assert sorted(_workers_answering(redis_port)) == ["default", "streams"], output
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        stop_deadline = time.monotonic() + 30
        while _group_members(proc.pid) and time.monotonic() < stop_deadline:
            proc.poll()
            time.sleep(0.2)
        still_running = _group_members(proc.pid)
        if still_running:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not still_running, f"outlived SIGTERM by 30 s: {still_running}"
    assert not _answers(web_port) and not _answers(redis_port)
