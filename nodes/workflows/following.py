"""Follow one launch for as long as it runs: store its log lines, move its phase, mark it ready
when it answers, watch its health, and notice when it dies or its node goes away.

One follower per launch holds a lease (``worker_token``/``worker_beat`` on the row); a follower
whose worker died is replaced by the reconciler once the lease is stale. Lines go to live viewers
as soon as they are read, and to the database through a writer of their own
(``log_writer``), with the byte offset they end at in one conditional update, so two followers
can never both store the same bytes, and a new one continues exactly where the record ends."""

from __future__ import annotations

import gzip
import io
import logging
import secrets as pysecrets
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from nodes import ssh
from nodes.domain import launch_plan as plan
from nodes.domain import timeline
from nodes.domain.log_lines import level_of, rank_of
from nodes.domain.logparse import Progress, advance
from nodes.domain.logtext import LineSplitter, Piece
from nodes.domain.redact import (
    mask_text,
    masked_lines,
    secret_values,
)
from nodes.domain.server_metrics import (
    ServerInfoError,
    effective_settings,
    load_sample,
    summarise_metrics,
)
from nodes.live import publish
from nodes.models import Launch
from nodes.models.choices import (
    LAUNCH_ENDED,
    LaunchStatus,
    NodeStatus,
)
from nodes.queue import later
from nodes.remote import client as agent
from nodes.services import (
    calibrations,
    commitments,
    hostkeys,
    launch_state,
    notifications,
    teardown,
)
from nodes.services.credentials import target_for
from nodes.services.launch_flags import flags_for
from nodes.services.launch_state import known_good_due
from nodes.workflows.log_writer import Batch, LeaseLost, LogWriter

log = logging.getLogger(__name__)

# How often the follower looks at what the node's watch said of the launch's processes: every
# second while it starts or ends, every five once it serves. The watch itself re-reads the
# group every STATUS_EVERY_S and reports only changes (and a beat).
STATUS_EVERY_S = 1.0
STATUS_EVERY_READY_S = 5.0
#: A ready server's memory is sampled this often (s) for its chart.
SERVING_SAMPLE_S = 30.0
#: The least time between two batches of a busy log (s): at 2,000 lines/s about ten lines go
#: together, and viewers, Redis and the panel each handle 200 words a second, not 500.
PUBLISH_EVERY_S = 0.005
#: Bytes read into one batch at most.
READ_MAX_BYTES = 1 << 20
#: A watch that said nothing this long (its lines come every few seconds) is restarted.
WATCH_QUIET_S = 30.0

HEALTH_FAILURES_TOLERATED = 3
#: Start-up phases that come after SGLang allocated its host pools (logparse's order).
PINNED_BY = ("warmup", "ready")

HEALTH_TIMEOUT_S = 25.0  # SGLang's /health waits up to 20 s for a generation (§5)


def follow(launch_id: int) -> None:
    Follower(launch_id).run()


class Follower:
    def __init__(self, launch_id: int) -> None:
        self.launch_id = launch_id
        self.token = pysecrets.token_hex(8)
        self.stamp_queued = False
        # When the follower next looks at the group, checks health, samples memory (monotonic s).
        self.next_beat = self.next_check = self.next_health = self.next_sample = 0.0
        self.down_since: float | None = None
        self.writer: LogWriter | None = None
        self.published = float("-inf")  # when the last batch went to viewers (monotonic s)
        # A multi-node launch's group (node 0's launch), whose one log this node's lines join.
        self.group_id: int | None = None

    # --- lease -----------------------------------------------------------------------------

    def _beat(self) -> Launch:
        """Renew the lease and return the launch as stored; raises ``LeaseLost``."""
        # While the writer's commits renew it, a read says whether it is still ours: the read
        # loop does not queue for the database's write lock behind the writer.
        writer = self.writer
        renewed = writer is not None and time.monotonic() - writer.renewed < STATUS_EVERY_S
        if not renewed and not Launch.objects.filter(
            pk=self.launch_id, worker_token=self.token
        ).update(worker_beat=timezone.now()):
            raise LeaseLost
        launch = Launch.objects.select_related("node", "revision").get(pk=self.launch_id)
        if launch.worker_token != self.token:
            raise LeaseLost
        return launch

    def run(self) -> None:
        if not launch_state.claim(self.launch_id, self.token, tuple(LaunchStatus)):
            return
        try:
            while True:
                launch = self._beat()
                if launch.log_complete or not launch.remote_dir or launch.pid is None:
                    return
                try:
                    self._session(launch)
                    return
                except ssh.RemoteError as exc:
                    self._unreachable(launch, exc)
        except LeaseLost:
            return
        finally:
            Launch.objects.filter(pk=self.launch_id, worker_token=self.token).update(
                worker_token="", worker_beat=None
            )

    # --- the node is away --------------------------------------------------------------------

    def _unreachable(self, launch: Launch, exc: ssh.RemoteError) -> None:
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            log.info("launch %s: %s unreachable: %s", launch.pk, launch.node.name, exc.message)
        away = now - self.down_since
        lost = away >= settings.RANKWISE_LOST_AFTER_SECONDS
        if exc.kind == "host_key_mismatch":
            self._key_changed(launch, exc)
        elif lost and launch.status not in LAUNCH_ENDED:  # noqa: SIM102 — the update decides
            why = f"{launch.node.name} has not answered for {away:.0f} s: {exc.message}"
            if teardown.mark_lost(launch, why):
                if teardown.group_members(launch):
                    teardown.lose_group(launch, why)
                first = Launch.objects.get(pk=launch.group_id or launch.pk)
                notifications.launch_event(first, "launch.lost")
        if launch.status in LAUNCH_ENDED and away > 600:
            # An ended launch whose node never came back: what was stored is all there is.
            Launch.objects.filter(pk=launch.pk).update(log_complete=True)
            raise LeaseLost
        time.sleep(min(5.0, 1.0 + away / 10))

    def _key_changed(self, launch: Launch, exc: ssh.RemoteError) -> None:
        """The node's host key changed: it cannot be reached safely, so nothing more is asked of
        it; the launch keeps its status (it is not lost: nobody knows) and says why it is not
        followed, until an admin trusts the new key."""
        if launch.node.status != NodeStatus.HOST_KEY_CHANGED:
            hostkeys.mark_changed(launch.node, exc)
        # A stop refused for the same reason keeps saying so: it is what the operator asked.
        Launch.objects.filter(pk=launch.pk).exclude(status__in=LAUNCH_ENDED).exclude(
            reason=self._key_note(launch)
        ).exclude(reason__startswith="stop failed").update(reason=self._key_note(launch))

    @staticmethod
    def _key_note(launch: Launch) -> str:
        return (
            f"{launch.node.name} cannot be reached safely (its host key changed): the launch is "
            "left as it is, not followed, until an admin trusts the new key"
        )

    def _back(self, launch: Launch) -> Launch:
        """The node answers again: a lost launch resumes the status it had."""
        self.down_since = None
        Launch.objects.filter(pk=launch.pk, reason=self._key_note(launch)).update(
            reason=f"{launch.node.name}'s new host key is trusted; following resumed"
        )
        if launch.status == LaunchStatus.LOST and teardown.group_members(launch):
            self._back_to_a_lost_group(launch)
            launch = self._beat()
        elif launch.status == LaunchStatus.LOST:
            launch_state.transition(
                launch.pk,
                launch.resume_status or LaunchStatus.STARTING,
                frm=[LaunchStatus.LOST],
                lost_since=None,
                reason=f"{launch.node.name} answers again; following resumed",
            )
            launch = self._beat()
        return launch

    def _back_to_a_lost_group(self, launch: Launch) -> None:
        """A node of a multi-node launch answers again after the launch was lost: the other
        nodes' ranks are gone, so its own are stopped and the launch ends failed."""
        why = f"{launch.node.name} answered again after the launch was lost: its ranks stopped"
        teardown.fail(launch.pk, why, spread=False)
        first_id = launch.group_id or launch.pk
        if launch_state.transition(
            first_id, LaunchStatus.FAILED, frm=[LaunchStatus.LOST], reason=launch.reason
        ):
            later("nodes.diagnose_launch", first_id)

    # --- one connection's worth of following --------------------------------------------------

    def _session(self, launch: Launch) -> None:
        client = ssh.connect(target_for(launch.node))
        try:
            self._follow(launch, client)
        finally:
            client.close()

    def _follow(self, launch: Launch, client: Any) -> None:
        status = agent.status(client, launch.remote_dir, timeout=10)  # where the log is
        launch = self._back(launch)
        self._resume(launch)
        splitter = LineSplitter()
        stream = ssh.stream(client, ["tail", "-c", f"+{self.offset + 1}", "-F", status.log])
        # One agent on the node reports what changed, instead of a status command a second;
        # it reports often enough for the memory timeline's samples.
        beat = min(STATUS_EVERY_READY_S, settings.RANKWISE_MEMORY_SAMPLE_SECONDS)
        watch = agent.Watch(client, launch.remote_dir, STATUS_EVERY_S, beat)
        self.writer = LogWriter(
            self.launch_id,
            self.token,
            self.offset,
            group_id=self.group_id,
            node=launch.node.name if self.group_id is not None else "",
        )
        try:
            while True:
                self._read_log(launch, stream, splitter)
                now = time.monotonic()
                if now < self.next_beat:
                    continue
                self.next_beat = now + STATUS_EVERY_S
                launch = self._beat()
                if self._group_ended(launch, watch, splitter, now):
                    return
                self._starting_or_serving(launch, client, watch, now)
        finally:
            stream.close()
            watch.close()
            writer, self.writer = self.writer, None
            writer.close()  # what was read is stored before anything reads the record

    def _resume(self, launch: Launch) -> None:
        """Pick up where the record ends (a new connection, a new follower)."""
        self.offset, self.seq = launch.log_offset, launch.last_seq
        # A multi-node launch's nodes write one log: the group's (node 0's launch).
        self.group_id = launch.group_id or (launch.pk if launch.parts.exists() else None)
        self.secrets = secret_values(list(launch.revision.args), dict(launch.revision.env or {}))
        self.progress = Progress.from_json(launch.progress)
        # Parsed once per connection: health polls read the API key and --enable-metrics.
        self.flags = flags_for(launch.revision, launch.node)
        self.health_failures = 0
        self.ranks_seen: dict[int, str] = {}
        self.next_beat = self.next_check = self.next_health = self.next_sample = 0.0
        self.sampled: float | None = None
        self.quiet_since = time.monotonic()

    def _read_log(self, launch: Launch, stream: ssh.Stream, splitter: LineSplitter) -> None:
        data = stream.read(0.1)
        if data is None:
            raise ssh.RemoteError("unreachable", "the log stream ended")
        # A busy stream goes out at most every PUBLISH_EVERY_S: what arrives meanwhile joins
        # the batch, so viewers, Redis and the panel handle fewer, bigger words. A line after
        # a quiet spell goes at once.
        due = self.published + PUBLISH_EVERY_S
        while data and len(data) < READ_MAX_BYTES and (left := due - time.monotonic()) > 0:
            more = stream.read(left)
            if not more:  # nothing more in time, or the end (seen on the next read)
                break
            data += more
        if data:
            self.published = time.monotonic()
            self.quiet_since = time.monotonic()
            self._store(launch, splitter.feed(data))
            if advance(self.progress, splitter.pending, partial=True):
                self._save_progress(launch)

    def _group_ended(
        self, launch: Launch, watch: agent.Watch, splitter: LineSplitter, now: float
    ) -> bool:
        """True once the process group is gone and every line is stored; fails the launch
        when a rank died. Raises ``RemoteError`` when the node can no longer be trusted or its
        agent went quiet."""
        if launch.node.status == NodeStatus.HOST_KEY_CHANGED:
            # This connection predates the change; nothing more goes over it.
            raise ssh.RemoteError("host_key_mismatch", launch.node.status_reason)
        watch.poll()
        if watch.quiet_for() > WATCH_QUIET_S:
            raise ssh.RemoteError(
                "timeout", f"the node agent's watch said nothing for {WATCH_QUIET_S:g} s"
            )
        status = watch.latest
        if status is None or (launch.status == LaunchStatus.READY and now < self.next_check):
            return False
        self.next_check = now + STATUS_EVERY_READY_S
        if status.alive:
            self._check_ranks(launch, status)
            return False
        if not self._drained(launch, status, splitter):
            return False
        self._ended(launch, status)
        return True

    def _starting_or_serving(
        self, launch: Launch, client: Any, watch: agent.Watch, now: float
    ) -> None:
        if launch.status in (LaunchStatus.STARTING, LaunchStatus.LOADING):
            if now >= self.next_sample:
                self.next_sample = now + settings.RANKWISE_MEMORY_SAMPLE_SECONDS
                self._sample(launch, watch.latest)
            if self._started_too_long(launch):
                teardown.fail(
                    launch.pk,
                    f"start-up did not reach ready within {launch.startup_timeout_s} s "
                    f"(last phase: {self.progress.phase or 'none'})",
                )
            elif launch.group_id is not None:
                self._try_part_ready(launch, client)
            elif self.progress.ready_line_seen:
                self._try_ready(launch, client)
        elif launch.status == LaunchStatus.READY:
            latest = watch.latest
            watched = latest is not None and None not in (latest.memory, latest.gpu_used)
            if now >= self.next_sample and watched:
                # The first right at ready (the host pools are pinned last), then sparser:
                # the chart covers the launch's life, bounded by timeline.MAX_SAMPLES. Only
                # what the watch reported: no probe of its own (a node cut off must not hold
                # this loop up on a new connection; the watch going quiet is what says so).
                self.next_sample = now + SERVING_SAMPLE_S
                self._sample(launch, latest)
            if now >= self.next_health:
                self.next_health = now + settings.RANKWISE_HEALTH_SECONDS
                self._health(launch, client)

    def _sample(self, launch: Launch, status: agent.GroupStatus | None) -> None:
        """Add the memory the watch last reported to the launch's timeline (a live probe where
        the node has no NVML for the watch to read)."""
        if status is None or status.memory is None or status.gpu_used is None:
            teardown.sample_memory(launch)
        elif status.time != self.sampled:
            self.sampled = status.time
            used = {int(i): b for i, b in status.gpu_used.items()}
            teardown.add_sample(launch, dict(status.memory), used)

    def _check_ranks(self, launch: Launch, status: agent.GroupStatus) -> None:
        """A TP rank that died (a kernel OOM kill, a crash) while the main process lives: SGLang
        ≤ 0.5.9 would wait on it for ever (§4), so the launch fails now, not at the timeout."""
        dead = plan.dead_ranks(self.ranks_seen, status.members)
        running = (LaunchStatus.STARTING, LaunchStatus.LOADING, LaunchStatus.READY)
        if dead and launch.status in running:
            when = "while serving" if launch.status == LaunchStatus.READY else "during start-up"
            # Only from the status read here: a group lost meanwhile had these ranks stopped
            # on purpose (teardown.lose_group), and stays lost.
            teardown.fail(launch.pk, f"{', '.join(dead)} died {when}", frm=[launch.status])

    def _drained(self, launch: Launch, status: agent.GroupStatus, splitter: LineSplitter) -> bool:
        """Every byte the dead server wrote is stored (a last line without ``\\n`` included)."""
        size = status.log_size or 0
        if self.offset >= size:
            return True
        if time.monotonic() - self.quiet_since < 1.0:
            return False
        rest = size - self.offset
        tail = splitter.feed(b"\n")
        if tail:
            self._store(launch, [Piece(tail[0].text, rest)])
        return self.offset >= size

    def _ended(self, launch: Launch, status: agent.GroupStatus) -> None:
        """The process group is gone and every line is read (and now stored)."""
        self._writing().flush()
        launch.refresh_from_db()
        # A lost group's node 0 was stopped on purpose (teardown.lose_group): it stays lost.
        group_lost = launch.status == LaunchStatus.LOST and launch.parts.exists()
        if (
            launch.status not in LAUNCH_ENDED
            and launch.status != LaunchStatus.STOPPING
            and not (group_lost)
        ):
            code = status.exit_status
            teardown.fail(
                launch.pk,
                f"the server exited with status {code}"
                if code is not None
                else "the server's processes are gone",
                frm=[launch.status],  # as read just now: a group lost since stays lost
            )
        Launch.objects.filter(pk=launch.pk, worker_token=self.token).update(log_complete=True)
        if launch.lines_dropped:
            self._archive(launch)
        # The whole log is stored now: diagnose again with every line the server wrote.
        if Launch.objects.filter(pk=launch.pk, status=LaunchStatus.FAILED).exists():
            later("nodes.diagnose_launch", launch.group_id or launch.pk)
        self._tell()

    def _started_too_long(self, launch: Launch) -> bool:
        started = launch.started or launch.created
        return timezone.now() > started + timedelta(seconds=launch.startup_timeout_s)

    # --- lines -----------------------------------------------------------------------------------

    def _writing(self) -> LogWriter:
        """The writer of this connection's lines (there is one while ``_follow`` runs)."""
        if self.writer is None:
            raise RuntimeError("lines are stored only while the log is followed")
        return self.writer

    def _store(self, launch: Launch, pieces: list[Piece]) -> None:
        if not pieces:
            return
        size = sum(p.size for p in pieces)
        raw = [p.text for p in pieces if p.text is not None]
        texts = [mask_text(t, self.secrets) for t in raw]
        rows = [(self.seq + i + 1, t, level_of(t), rank_of(t)) for i, t in enumerate(texts)]
        # Viewers get the lines now, before anything else is done with them; the writer makes
        # them the record. Were its commit to fail, the next follower stores the same lines under
        # the same numbers (it reads on from the stored offset): nothing shown is contradicted.
        # A group's lines are numbered, then published, by the writer's commit (several nodes
        # number one log).
        announced = (
            publish(self.launch_id, self.seq + len(rows), rows)
            if rows and self.group_id is None
            else True
        )
        # Numbers are read from what the server wrote, not from the masked copy.
        changed = any([advance(self.progress, t) for t in raw])
        progress = self.progress.to_json() if changed else None
        self._writing().put(Batch(rows, size, progress, announced))
        self.offset += size
        self.seq += len(rows)
        if changed:
            self._loading(launch)

    def _save_progress(self, launch: Launch) -> None:
        # Through the writer, so an older batch's progress never lands after this one; stored
        # before the word goes out, since viewers read the phase from the record.
        self._writing().put(Batch([], 0, self.progress.to_json()))
        self._writing().flush()
        self._loading(launch)
        self._tell()

    def _loading(self, launch: Launch) -> None:
        if self.progress.phase in PINNED_BY:
            # Its host pools are allocated: MemAvailable counts them from now on.
            commitments.mark_pinned(self.launch_id)
        if self.progress.phase:
            launch_state.transition(
                self.launch_id, LaunchStatus.LOADING, frm=[LaunchStatus.STARTING]
            )

    def _archive(self, launch: Launch) -> None:
        """Keep the whole log with the launch, since the database kept only part of it."""
        # Masked line by line as it streams in: the node's file holds secrets in clear (the
        # server prints its ServerArgs), the archive must not.
        buffer = io.BytesIO()
        try:
            with (
                ssh.pool.session(target_for(launch.node)) as client,
                gzip.GzipFile(fileobj=buffer, mode="wb") as archive,
            ):
                stream = ssh.stream(client, ["cat", f"{launch.remote_dir}/server.log"])
                for line in masked_lines(_chunks(stream), self.secrets):
                    archive.write(line)
        except ssh.RemoteError as exc:
            log.warning("launch %s: log not archived: %s", launch.pk, exc.message)
            return
        Launch.objects.filter(pk=launch.pk).update(log_archive=buffer.getvalue())

    # --- health ----------------------------------------------------------------------------------

    def _headers(self, launch: Launch) -> dict[str, str]:
        key = self.flags.get("api_key")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _try_ready(self, launch: Launch, client: Any) -> None:
        """Ready only when /health answers 200 and the server says what it runs with; until
        then the launch stays ``loading`` (the start-up timeout bounds the wait)."""
        try:
            status, _ = ssh.http_get(client, launch.port, "/health", timeout=HEALTH_TIMEOUT_S)
            info = self._server_info(launch, client) if status == 200 else None
        except ssh.RemoteError as exc:
            if exc.kind not in ("refused", "timeout"):
                raise
            info, status = None, 0
        if info is None:
            waiting = f"ready line seen; waiting for /health and /get_server_info ({status})"
            Launch.objects.filter(pk=launch.pk).exclude(reason=waiting).update(reason=waiting)
            return
        behind = [
            f"{p.node.name} (node rank {p.node_rank}, {p.status})"
            for p in launch.parts.select_related("node").order_by("node_rank")
            if p.status != LaunchStatus.READY
        ]
        if behind:
            waiting = "node 0 answers; waiting for the ranks of " + ", ".join(behind)
            Launch.objects.filter(pk=launch.pk).exclude(reason=waiting).update(reason=waiting)
            return
        fields: dict[str, Any] = {
            "ready_at": timezone.now(),
            "health_at": timezone.now(),
            "server_info": info,
            "reason": "",
        }
        metrics = self._metrics(launch, client)
        if metrics is not None:
            fields["metrics"] = metrics
        if launch_state.transition(
            launch.pk,
            LaunchStatus.READY,
            frm=[LaunchStatus.STARTING, LaunchStatus.LOADING],
            **fields,
        ):
            notifications.launch_event(Launch.objects.get(pk=launch.pk), "launch.ready")
            calibrations.record_ready(launch.pk)
        self._tell()

    def _tell(self) -> None:
        """Word to the viewers that the record moved (lines stored, a phase, a status)."""
        if self.group_id is None:
            publish(self.launch_id, self.seq)
        else:
            publish(
                self.group_id,
                Launch.objects.values_list("last_seq", flat=True).get(pk=self.group_id),
            )

    def _part_gone(self, launch: Launch) -> bool:
        """A multi-node launch serving without one of its nodes' parts (ended, lost): its
        collectives would hang on the next request, so it fails, naming the node."""
        if self.group_id != launch.pk:
            return False
        # A part stopping is the group's stop under way (its parts are marked first).
        gone = (
            launch.parts.exclude(status__in=[LaunchStatus.READY, LaunchStatus.STOPPING])
            .select_related("node")
            .first()
        )
        if gone is None:
            return False
        teardown.fail(
            launch.pk,
            f"{gone.node.name} (node rank {gone.node_rank}) is {gone.status} while node 0 "
            f"serves: {gone.reason or 'its ranks are gone'}",
        )
        return True

    def _try_part_ready(self, launch: Launch, client: Any) -> None:
        """A node of rank ≥ 1 serves no requests: once its ranks are ready it answers a dummy
        ``/health`` (200, always) on the server's port (SGLang's engine.py, node_rank ≥ 1)."""
        try:
            status, _ = ssh.http_get(client, launch.port, "/health", timeout=5)
        except ssh.RemoteError as exc:
            if exc.kind not in ("refused", "timeout"):
                raise
            return
        if status != 200:
            return
        # Its ranks print no ready line (node 0's HTTP server does): its phase is ready now.
        self.progress.phase = "ready"
        if launch_state.transition(
            launch.pk,
            LaunchStatus.READY,
            frm=[LaunchStatus.STARTING, LaunchStatus.LOADING],
            ready_at=timezone.now(),
            health_at=timezone.now(),
            reason="",
            progress=self.progress.to_json(),
        ):
            self._tell()

    def _server_info(self, launch: Launch, client: Any) -> dict[str, Any] | None:
        """The effective settings (``/get_server_info``, or ``/server_info`` where the old
        path is gone), or ``None`` when neither answered with them yet."""
        for path in ("/get_server_info", "/server_info"):
            status, body = ssh.http_get(client, launch.port, path, headers=self._headers(launch))
            if status == 200:
                try:
                    return effective_settings(body)
                except ServerInfoError as exc:
                    log.warning("launch %s: %s answered: %s", launch.pk, path, exc)
                    return None
            log.info("launch %s: %s answered %s", launch.pk, path, status)
        return None

    def _metrics(self, launch: Launch, client: Any) -> dict[str, float] | None:
        if not self.flags.get("enable_metrics"):
            return None
        try:
            status, body = ssh.http_get(client, launch.port, "/metrics", timeout=10)
        except ssh.RemoteError:
            return None
        if status != 200:
            return None
        # No gauge yet (the server exports them once its first scrape is ready): nothing to keep.
        return summarise_metrics(body.decode(errors="replace")) or None

    def _health(self, launch: Launch, client: Any) -> None:
        try:
            status, _ = ssh.http_get(client, launch.port, "/health", timeout=HEALTH_TIMEOUT_S)
            problem = "" if status == 200 else f"/health answered {status}"
        except ssh.RemoteError as exc:
            if exc.kind == "unreachable":
                raise
            problem = exc.message
        if not problem:
            self.health_failures = 0
            fields: dict[str, Any] = {"health_at": timezone.now()}
            metrics = self._metrics(launch, client)
            if metrics is not None:
                fields["metrics"] = metrics
                began = launch.started or launch.created
                t = (fields["health_at"] - began).total_seconds()
                # The series the capacity advisor reads (bounded; the first and latest stay).
                series = launch.metrics_series or []
                fields["metrics_series"] = timeline.append_load(
                    series, load_sample(series[-1] if series else None, metrics, t)
                )
            Launch.objects.filter(pk=launch.pk).update(**fields)
            launch.refresh_from_db()
            if self._part_gone(launch):
                return
            if launch.group_id is None and known_good_due(launch) and not self.stamp_queued:
                later("nodes.stamp_launch", launch.pk)
                self.stamp_queued = True
            return
        self.health_failures += 1
        if self.health_failures >= HEALTH_FAILURES_TOLERATED:
            teardown.fail(
                launch.pk, f"health check failed {self.health_failures} times in a row: {problem}"
            )


def _chunks(stream: ssh.Stream) -> Iterator[bytes]:
    """What a finite remote command prints, until it ends."""
    while (chunk := stream.read(30)) is not None:
        yield chunk
