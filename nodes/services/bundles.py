"""Bundles on disk and over HTTP: a launch's bundle as a ``.tar.gz``, a bundle read from a
folder or an archive (without extracting anything to disk), and what the diagnosis engine makes
of one."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from nodes.domain.bundle import (
    BundleError,
    case_snapshot,
    check_facts,
    launch_facts,
    timeline_snapshots,
)
from nodes.domain.diagnosis import Diagnosis, diagnose
from nodes.domain.env_policy import env_sizes
from nodes.domain.log_lines import with_node
from nodes.domain.redact import masked_lines, redact_args, redact_env, secret_values
from nodes.domain.sglang_flags import VERSION_TEXT, parse_command, split_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Launch
from nodes.services import model_facts, teams
from nodes.services.launch_flags import args_of

MAX_LOG_BYTES = 256 * 2**20
MAX_LOG_LINES = 2_000_000
MAX_UPLOAD_LOG_BYTES = 64 * 2**20
# A real server's failed start-up is a few thousand lines; the diagnosis reads every line
# against every rule, so an upload's log is bounded in lines as well as bytes (a 64 MiB log of
# newlines is 67 million lines).
MAX_UPLOAD_LOG_LINES = 250_000
READ_CHUNK = 1 << 20
MAX_FACTS_BYTES = 16 * 2**20
MAX_MEMBERS = 1000
MAX_ARCHIVE_BYTES = 512 * 2**20


def archived_log(launch: Launch) -> Iterator[bytes]:
    """The launch's archived whole log (stored when lines were dropped from the database),
    masked line by line as it is read: secret values of its revision and every secret the text
    names. (Archives written before the follower masked them hold the node's raw log.)"""
    revision = launch.revision
    secrets = secret_values(list(revision.args), dict(revision.env or {}))
    with gzip.GzipFile(fileobj=io.BytesIO(bytes(launch.log_archive or b""))) as raw:
        yield from masked_lines(iter(lambda: raw.read(1 << 16), b""), secrets)


def launch_log_text(launch: Launch) -> str:
    """The launch's whole log as stored (the archive when lines were dropped), masked. A
    multi-node launch's one log (its nodes' lines, stored on the group's launch) has each line
    after ``[NODE] ``, the node that printed it; a part of one gives its group's log."""
    launch = launch.group or launch
    if launch.log_archive:
        return b"".join(archived_log(launch)).decode(errors="replace")
    # Only a multi-node launch's lines carry a node ("" on one node): those alone are tagged.
    tagged = launch.lines.order_by("seq").values_list("node", "text")
    return "".join(f"{with_node(text, node)}\n" for node, text in tagged.iterator(chunk_size=5000))


def _several_nodes(launch: Launch) -> bool:
    """Whether ``launch`` is the group launch of a multi-node launch (it has parts)."""
    return launch.group_id is None and launch.parts.exists()


def _snapshots_of(launch: Launch) -> list[dict[str, Any]]:
    """One launch's snapshots on its node, oldest first: the memory timeline's first sample is
    the ``before_launch`` snapshot, its lowest MemAvailable a ``during`` one, then the snapshot
    taken at the failure (with the panel's reason among its notes), then the last cleanup's."""
    snapshots = timeline_snapshots(list(launch.memory_timeline or []), launch.started)
    if launch.snapshot:
        after = case_snapshot(launch.snapshot, "after_failure")
        if launch.reason:
            after["notes"] = [f"panel: {launch.reason}", *after.get("notes", [])]
        snapshots.append(after)
    cleaned = launch.cleanups.exclude(result=None).order_by("-created").first()
    if cleaned is not None:
        snapshots.append(
            cleanup_snapshot(cleaned.result or {}, cleaned.message, _others_hidden(launch, cleaned))
        )
    return snapshots


def group_facts(launch: Launch, flags: dict[str, Any]) -> list[dict[str, Any]]:
    """``extra.group`` of a multi-node launch's bundle: every node in node-rank order, as
    ``{"name", "node_rank", "tp_ranks", "snapshots"}``; node R runs TP ranks R × per … R × per +
    per − 1, per = tp × pp / nnodes (``flags``: the command's values by dest)."""
    parts = [launch, *launch.parts.select_related("node").order_by("node_rank")]
    tp = int(flags.get("tensor_parallel_size") or flags.get("tp_size") or 1)
    pp = int(flags.get("pipeline_parallel_size") or flags.get("pp_size") or 1)
    per = max(tp * pp // len(parts), 1)
    return [
        {
            "name": part.node.name,
            "node_rank": part.node_rank,
            "tp_ranks": list(range(part.node_rank * per, part.node_rank * per + per)),
            "snapshots": _snapshots_of(part),
        }
        for part in parts
    ]


def facts_of(launch: Launch) -> dict[str, object]:
    """The bundle's ``facts.json`` of ``launch`` (``_snapshots_of``). A multi-node launch's
    (its group launch's, for a part) is node 0's facts with ``nodes_in_launch`` and every
    node's ranks and snapshots in ``extra.group`` (``group_facts``)."""
    launch = launch.group or launch
    node = launch.node
    snapshots = _snapshots_of(launch)
    model = model_facts.stored_answer(node, args_of(launch))
    facts = launch_facts(
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
            *redact_args(args_of(launch)),
        ],
        env=redact_env({**(launch.revision.env or {}), "CUDA_VISIBLE_DEVICES": launch.gpu_list()}),
        exit_code=launch.exit_status,
        snapshots=snapshots,
        model_config=model.get("config"),
        model_weights_bytes=model.get("weights_bytes"),
        extra={
            "rankwise_launch": launch.pk,
            "status": launch.status,
            "reason": launch.reason,
            "checks": launch.checks,
            "progress": launch.progress,
            "server_info": launch.server_info,
            "ready_at": launch.ready_at.isoformat() if launch.ready_at else None,
            "memory_timeline": launch.memory_timeline,
            # Their host pools and this launch's share the node's RAM (the diagnosis names them).
            "other_launches_on_node": (launch.snapshot or {}).get("neighbours"),
            # What execve was given, measured before secrets are masked (exec_failure reads it).
            **env_sizes({**(launch.revision.env or {}), "CUDA_VISIBLE_DEVICES": launch.gpu_list()}),
        },
    )
    if _several_nodes(launch):
        group = group_facts(launch, bundle_flags(facts))
        facts["nodes_in_launch"] = len(group)
        facts["extra"]["group"] = group
    return facts


def cleanup_snapshot(
    result: dict[str, Any], message: str, hidden: set[int] | frozenset[int] = frozenset()
) -> dict[str, Any]:
    """A cleanup's final reading as the bundle's ``after_cleanup`` snapshot; a holder of a
    launch in ``hidden`` (another team's team-only launch) is said to be one, nothing more."""
    host = result.get("host") or {}
    gpus = result.get("gpus") or []
    return {
        "phase": "after_cleanup",
        "meminfo": {
            "MemTotal": host.get("mem_total_bytes"),
            "MemAvailable": host.get("mem_available_bytes"),
        },
        "gpus": [{"index": g["index"], "memory_used_bytes": g["memory_used_bytes"]} for g in gpus],
        "gpu_processes": [
            {
                "gpu_index": g["index"],
                "pid": h["pid"],
                "name": "a team-only launch's process"
                if h.get("launch_id") in hidden
                else h["command"],
            }
            for g in gpus
            for h in g.get("holders") or []
        ],
        "notes": [f"cleanup: {message}"] if message else [],
    }


def _others_hidden(launch: Launch, cleaned: Any) -> set[int]:
    """Team-only launches, other than ``launch``, whose processes the cleanup found: anyone
    who may see ``launch`` may download its bundle, so they are not described there."""
    ids = {
        h.get("launch_id")
        for g in (cleaned.result or {}).get("gpus") or []
        for h in g.get("holders") or []
    }
    ids.discard(None)
    ids.discard(launch.pk)
    return set(teams.team_only_launches().filter(pk__in=ids).values_list("pk", flat=True))


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
    if not path.is_file():
        raise BundleError(f"{path}: no such folder or file")
    return _read_archive(
        path.name, lambda: tarfile.open(path, mode="r:*"), "neither a bundle folder nor "
    )


def read_bundle_file(upload: IO[bytes] | Any) -> tuple[str, dict[str, object]]:
    """(launch.log text, facts) from an uploaded archive (a file object with ``name``); its log
    may be at most ``MAX_UPLOAD_LOG_BYTES`` and ``MAX_UPLOAD_LOG_LINES`` lines, refused as soon
    as the decompressed stream passes either. Raises ``BundleError``."""
    name = str(getattr(upload, "name", "bundle"))
    return _read_archive(
        name,
        lambda: tarfile.open(fileobj=upload, mode="r:*"),
        "not ",
        MAX_UPLOAD_LOG_BYTES,
        MAX_UPLOAD_LOG_LINES,
    )


def _read_archive(
    name: str,
    open_archive: Callable[[], tarfile.TarFile],
    what: str,
    max_log: int = MAX_LOG_BYTES,
    max_lines: int = MAX_LOG_LINES,
) -> tuple[str, dict[str, object]]:
    """The two files of the one bundle folder in an archive, read as the archive streams by:
    at most ``MAX_MEMBERS`` entries and ``MAX_ARCHIVE_BYTES`` expanded, one of each file."""
    found: dict[str, tuple[str, bytes]] = {}
    try:
        with open_archive() as archive:
            expanded = 0
            for count, member in enumerate(iter(archive.next, None), 1):
                expanded += max(member.size, 0)
                if count > MAX_MEMBERS or expanded > MAX_ARCHIVE_BYTES:
                    raise BundleError(
                        f"{name} holds more than {MAX_MEMBERS} entries or "
                        f"{MAX_ARCHIVE_BYTES // 2**20} MiB: not a bundle"
                    )
                base = PurePosixPath(member.name).name
                if not member.isfile() or base not in ("launch.log", "facts.json"):
                    continue
                if base in found:
                    raise BundleError(f"{name} holds more than one {base}: one bundle at a time")
                limit = max_log if base == "launch.log" else MAX_FACTS_BYTES
                if member.size > limit:
                    raise BundleError(f"{base} is larger than {limit // 2**20} MiB")
                handle = archive.extractfile(member)
                folder = str(PurePosixPath(member.name).parent)
                lines = max_lines if base == "launch.log" else None
                found[base] = (folder, _read_bounded(handle, base, limit, lines))
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, tarfile.ReadError) and "could not be opened" in str(exc):
            reason = "not a .tar, .tar.gz, .tar.bz2 or .tar.xz file"
        raise BundleError(f"{name} is {what}a tar archive: {reason}") from None
    folders = {folder for folder, _ in found.values()}
    if len(folders) > 1:
        raise BundleError(f"{name}: launch.log and facts.json must be in the same folder")
    return _read(lambda base: found[base][1] if base in found else None)


def _read_bounded(handle: IO[bytes] | None, base: str, limit: int, lines: int | None) -> bytes:
    """The member's bytes, read in chunks as they decompress; ``BundleError`` as soon as more
    than ``limit`` bytes or ``lines`` newlines came out (the header's size can lie)."""
    if handle is None:
        return b""
    chunks: list[bytes] = []
    size = newlines = 0
    while chunk := handle.read(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise BundleError(f"{base} is larger than {limit // 2**20} MiB")
        if lines is not None:
            newlines += chunk.count(b"\n")
            if newlines > lines:
                raise BundleError(f"{base} has more than {lines:,} lines: not read")
        chunks.append(chunk)
    return b"".join(chunks)


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
        doc = json.loads(facts, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BundleError(f"facts.json is not JSON: {reason}") from None
    return log.decode(errors="replace"), check_facts(doc)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def diagnose_bundle(log_text: str, facts: dict[str, Any]) -> Diagnosis:
    """The diagnosis of a bundle (``launch.log`` text, ``facts.json``): the command's flags are
    read as the bundle's engine version parses them; with no command, none (the rules then
    read the log's ``server_args``, not SGLang's defaults)."""
    return diagnose(log_text, facts, bundle_flags(facts))


#: A launch command longer than this is not a real one; parsing is cut there (argparse's
#: prefix matching costs words x options).
MAX_COMMAND_WORDS = 2000


def bundle_flags(facts: dict[str, Any]) -> dict[str, Any]:
    """The command's values by dest as the bundle's SGLang version parses them; ``{}`` when
    the bundle has no readable command."""
    command = facts.get("command") or []
    words = [str(w) for w in command[:MAX_COMMAND_WORDS]] if isinstance(command, list) else []
    try:
        argv, _ = split_command(words)
    except ValueError:
        argv = []
    if not argv:
        return {}
    version = facts.get("engine_version")
    if not (isinstance(version, str) and VERSION_TEXT.fullmatch(version)):
        version = DEFAULT_VERSION  # an engine version we cannot read: parse as the default does
    return dict(parse_command(argv, table(version)).values)
