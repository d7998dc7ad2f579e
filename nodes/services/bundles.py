"""Bundles on disk and over HTTP: a launch's bundle as a ``.tar.gz``, and a bundle read from a
folder or an archive (without extracting anything to disk)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from nodes.domain.bundle import (
    BundleError,
    case_snapshot,
    check_facts,
    launch_facts,
    timeline_snapshots,
)
from nodes.domain.redact import redact_args, redact_env
from nodes.models import Launch
from nodes.services import launches

MAX_LOG_BYTES = 256 * 2**20
MAX_FACTS_BYTES = 16 * 2**20


def launch_log_text(launch: Launch) -> str:
    """The launch's whole log as stored (the archive when lines were dropped)."""
    if launch.log_archive:
        return gzip.decompress(bytes(launch.log_archive)).decode(errors="replace")
    lines = launch.lines.order_by("seq").values_list("text", flat=True)
    return "".join(f"{text}\n" for text in lines.iterator(chunk_size=5000))


def facts_of(launch: Launch) -> dict[str, object]:
    """The bundle's ``facts.json`` of ``launch``: the memory timeline's first sample is the
    ``before_launch`` snapshot, its lowest MemAvailable a ``during`` one, then the snapshot
    taken at the failure (with the panel's reason among its notes)."""
    node = launch.node
    snapshots = timeline_snapshots(list(launch.memory_timeline or []), launch.started)
    if launch.snapshot:
        after = case_snapshot(launch.snapshot, "after_failure")
        if launch.reason:
            after["notes"] = [f"panel: {launch.reason}", *after.get("notes", [])]
        snapshots.append(after)
    return launch_facts(
        engine_version=node.sglang_version or launch.revision.sglang_version or None,
        node={
            "name": node.name,
            "host_ram_bytes": node.host_ram_bytes,
            "gpus": [
                {"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes}
                for g in node.gpus.all()
            ],
        },
        command=[
            node.sglang_python,
            "-m",
            "sglang.launch_server",
            *redact_args(launches.args_of(launch)),
        ],
        env=redact_env({**(launch.revision.env or {}), "CUDA_VISIBLE_DEVICES": launch.gpu_list()}),
        exit_code=launch.exit_status,
        snapshots=snapshots,
        extra={
            "rankwise_launch": launch.pk,
            "status": launch.status,
            "reason": launch.reason,
            "checks": launch.checks,
            "progress": launch.progress,
            "server_info": launch.server_info,
            "ready_at": launch.ready_at.isoformat() if launch.ready_at else None,
            "memory_timeline": launch.memory_timeline,
        },
    )


def launch_bundle(launch: Launch) -> bytes:
    """``launch-<id>/launch.log`` and ``launch-<id>/facts.json`` as a gzipped tar."""
    folder = f"launch-{launch.pk}"
    files = {
        "launch.log": launch_log_text(launch).encode(),
        "facts.json": json.dumps(facts_of(launch), indent=1).encode(),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def read_bundle(path: str | Path) -> tuple[str, dict[str, object]]:
    """(launch.log text, facts) from a bundle folder or ``.tar.gz``; raises ``BundleError``."""
    path = Path(path)
    if path.is_dir():
        return _read(lambda name: _file(path / name))
    return _read_archive(path.name, lambda: tarfile.open(path, mode="r:*"))


def read_bundle_file(upload: IO[bytes] | Any) -> tuple[str, dict[str, object]]:
    """(launch.log text, facts) from an uploaded archive (a file object with ``name``);
    raises ``BundleError``."""
    name = str(getattr(upload, "name", "bundle"))
    return _read_archive(name, lambda: tarfile.open(fileobj=upload, mode="r:*"))


def _read_archive(
    name: str, open_archive: Callable[[], tarfile.TarFile]
) -> tuple[str, dict[str, object]]:
    try:
        with open_archive() as archive:
            members = {
                Path(m.name).name: m for m in archive.getmembers() if m.isfile() and m.size >= 0
            }

            def member(name: str) -> bytes | None:
                found = members.get(name)
                if found is None:
                    return None
                limit = MAX_LOG_BYTES if name == "launch.log" else MAX_FACTS_BYTES
                if found.size > limit:
                    raise BundleError(f"{name} is larger than {limit // 2**20} MiB")
                handle = archive.extractfile(found)
                return handle.read() if handle else None

            return _read(member)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"{name} is neither a bundle folder nor a tar archive: {exc}") from None


def _file(path: Path) -> bytes | None:
    if not path.is_file():
        return None
    limit = MAX_LOG_BYTES if path.name == "launch.log" else MAX_FACTS_BYTES
    if path.stat().st_size > limit:
        raise BundleError(f"{path.name} is larger than {limit // 2**20} MiB")
    return path.read_bytes()


def _read(get: Callable[[str], bytes | None]) -> tuple[str, dict[str, object]]:
    log, facts = get("launch.log"), get("facts.json")
    if log is None or facts is None:
        raise BundleError("a bundle needs launch.log and facts.json")
    try:
        doc = json.loads(facts)
    except ValueError as exc:
        raise BundleError(f"facts.json is not JSON: {exc}") from None
    return log.decode(errors="replace"), check_facts(doc)
