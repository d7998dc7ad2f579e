"""The stand-in's scheduler loop under load: requests admitted against the device token pool,
the rest queued, running requests retracted when decode runs out of tokens, prefixes cached.

Written from SGLang's scheduler (``srt/managers/scheduler.py``, ``schedule_policy.py``,
``schedule_batch.py``, ``mem_cache/radix_cache.py``, ``hiradix_cache.py``), not from the
panel's code:

- **Admission** (``PrefillAdder``): a waiting request runs only if its uncached input plus
  ``min(max_new_tokens, 4096) × new_token_ratio`` fits in the free + evictable tokens less what
  every running request is still expected to need (its remaining ``max_new_tokens`` × the same
  ratio); new input per prefill batch is capped by ``--max-prefill-tokens``, and the number
  running by ``max_running_requests``. First come, first served; admission stops at the first
  request that does not fit (``NO_TOKEN``).
- **new_token_ratio** starts at 0.7 (``SGLANG_INIT_NEW_TOKEN_RATIO``), falls by
  (0.7 − 0.7 × 0.14) / 600 per decode step to its floor, and jumps after a retraction.
- **Retraction** (``ScheduleBatch.retract_decode``): when a decode step cannot get one token per
  running request, the requests with the fewest output tokens (the longest input breaking
  ties) go back to the queue until the rest can decode ``RETRACT_DECODE_STEPS`` more steps;
  logged as ``KV cache pool is full. Retract requests. #retracted_reqs: …``.
- **Prefix cache** (RadixAttention): a finished request's tokens stay cached, evictable
  (LRU) when nobody uses them; a new request whose input starts with cached tokens does not
  prefill them again (``cache_hit_rate``). With HiCache (``HiRadixCache``) a page evicted from
  the device is kept in the host pool and loaded back on a hit — it still needs device tokens
  to run, so HiCache saves prefill, not concurrency.

Matching is by pages of ``PAGE`` tokens (a hash of the page and everything before it).
Time is simulated: a decode step takes ``DECODE_BASE_S + DECODE_PER_REQ_S × batch`` (scaled by
the fleet's speed), a prefill ``PREFILL_BASE_S + tokens / PREFILL_TOKENS_PER_S``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PAGE = 64
CLIP_MAX_NEW_TOKENS = int(os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "4096"))
INIT_RATIO = float(os.environ.get("SGLANG_INIT_NEW_TOKEN_RATIO", "0.7"))
MIN_RATIO = INIT_RATIO * float(os.environ.get("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", "0.14"))
DECAY_STEPS = int(os.environ.get("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "600"))
RETRACT_DECODE_STEPS = 20
DECODE_LOG_INTERVAL = 40
DECODE_BASE_S = 0.02
DECODE_PER_REQ_S = 0.0008
PREFILL_BASE_S = 0.02
PREFILL_TOKENS_PER_S = 40_000.0
THROUGHPUT_WINDOW_S = 5.0
TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


def page_keys(input_ids: list[int]) -> list[bytes]:
    """One key per whole page of ``input_ids``: a digest of the page and all before it."""
    keys, digest = [], hashlib.blake2b(digest_size=16)
    for start in range(0, len(input_ids) - PAGE + 1, PAGE):
        digest.update(b",".join(str(t).encode() for t in input_ids[start : start + PAGE]))
        keys.append(digest.copy().digest())
    return keys


@dataclass(eq=False)
class Request:
    input_len: int
    max_new_tokens: int
    pages: list[bytes]
    arrived: float = field(default_factory=time.monotonic)
    generated: int = 0
    locked: list[bytes] = field(default_factory=list)  # cached pages it uses
    private: int = 0  # tokens of its own: the input's tail, then what it generated
    cached_tokens: int = 0
    first_token_at: float | None = None
    aborted: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def remaining(self) -> int:
        return min(self.max_new_tokens - self.generated, CLIP_MAX_NEW_TOKENS)


class Engine:
    """One scheduler's loop (rank 0 speaks for all: TP ranks step together)."""

    def __init__(
        self,
        *,
        pool_tokens: int,
        max_running: int,
        max_prefill_tokens: int,
        host_tokens: int,
        speed: float,
        log: Callable[[str], None],
    ) -> None:
        self.pool, self.max_running, self.max_prefill = pool_tokens, max_running, max_prefill_tokens
        self.host_pages = host_tokens // PAGE
        self.speed, self.log = speed, log
        self.ratio = INIT_RATIO
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        # Device prefix cache: page → users; evictable when 0, in LRU order (oldest first).
        self.users: dict[bytes, int] = {}
        self.evictable: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.host: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.retracted_total = 0
        # What SGLang's collector counts (srt/metrics/collector.py): time to first token (a
        # histogram, simulated seconds) and, per finished request, its tokens.
        self.ttft_buckets = [0] * len(TTFT_BUCKETS)
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.prompt_tokens_total = self.generation_tokens_total = self.requests_total = 0
        self.input_total = self.hit_total = 0
        self.generated: collections.deque[tuple[float, int]] = collections.deque()
        self.steps = 0
        self.lock = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    # --- what clients call ----------------------------------------------------------------

    def submit(self, input_ids: list[int], max_new_tokens: int) -> Request:
        request = Request(len(input_ids), max(1, max_new_tokens), page_keys(input_ids))
        with self.lock:
            self.waiting.append(request)
            self.lock.notify()
        return request

    def abort(self, request: Request) -> None:
        with self.lock:
            if request in self.waiting:
                self.waiting.remove(request)
            elif request in self.running:
                self.running.remove(request)
                self._free(request)
            request.aborted = True
            request.done.set()

    def gauges(self) -> dict[str, float]:
        """SGLang's gauges (``srt/metrics/collector.py``), as of now."""
        with self.lock:
            used = self._used()
            now = time.monotonic()
            while self.generated and self.generated[0][0] < now - THROUGHPUT_WINDOW_S:
                self.generated.popleft()
            tokens = sum(n for _, n in self.generated)
            return {
                "num_running_reqs": len(self.running),
                "num_queue_reqs": len(self.waiting),
                "num_used_tokens": used,
                "token_usage": round(used / self.pool, 4) if self.pool else 0.0,
                "gen_throughput": round(tokens / (THROUGHPUT_WINDOW_S * self.speed), 2),
                "cache_hit_rate": (
                    round(self.hit_total / self.input_total, 4) if self.input_total else 0.0
                ),
                "num_retracted_reqs": self.retracted_total,
            }

    def histograms(self) -> dict[str, tuple[list[tuple[float, int]], float, int]]:
        """Histograms as ``{name: ([(upper bound, cumulative count)], sum, count)}``."""
        with self.lock:
            running, cumulative = 0, []
            for bound, n in zip(TTFT_BUCKETS, self.ttft_buckets, strict=True):
                running += n
                cumulative.append((bound, running))
            return {"time_to_first_token_seconds": (cumulative, self.ttft_sum, self.ttft_count)}

    def counters(self) -> dict[str, int]:
        with self.lock:
            return {
                "prompt_tokens_total": self.prompt_tokens_total,
                "generation_tokens_total": self.generation_tokens_total,
                "num_requests_total": self.requests_total,
            }

    def _count_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_count += 1
        for index, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_buckets[index] += 1
                break

    # --- the pool ---------------------------------------------------------------------------

    def _used(self) -> int:
        return PAGE * (len(self.users) - len(self.evictable)) + sum(r.private for r in self.running)

    def _available(self) -> int:
        return self.pool - self._used() - PAGE * len(self.evictable)

    def _evict(self, tokens: int, keep: frozenset[bytes] = frozenset()) -> bool:
        """Free ``tokens`` by evicting unused cached pages but ``keep``, oldest first (to the
        host pool with HiCache). False when even all of them would not do."""
        for page in [p for p in self.evictable if p not in keep]:
            if self._available() >= tokens:
                break
            del self.evictable[page]
            del self.users[page]
            if self.host_pages:
                self.host[page] = None
                self.host.move_to_end(page)
                while len(self.host) > self.host_pages:
                    self.host.popitem(last=False)
        return self._available() >= tokens

    def _free(self, request: Request) -> None:
        for page in request.locked:
            self.users[page] -= 1
            if self.users[page] == 0:
                self.evictable[page] = None
        request.locked, request.private = [], 0

    # --- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self.waiting and not self.running:
                    self.lock.wait()
                admitted, extend, cached = self._admit()
                if admitted:
                    self.log(
                        f"Prefill batch, #new-seq: {len(admitted)}, #new-token: {extend}, "
                        f"#cached-token: {cached}, token usage: {self._used() / self.pool:.2f}, "
                        f"#running-req: {len(self.running) - len(admitted)}, "
                        f"#queue-req: {len(self.waiting)}, "
                    )
            if admitted:
                time.sleep((PREFILL_BASE_S + extend / PREFILL_TOKENS_PER_S) / self.speed)
                with self.lock:
                    now = time.monotonic()
                    for request in admitted:
                        if request.first_token_at is None:
                            request.first_token_at = now
                            self._count_ttft((now - request.arrived) * self.speed)
            with self.lock:
                batch = len(self.running)
                if batch:
                    self._decode()
                elif not admitted:
                    self.lock.wait(0.5)  # nothing runs and nothing fits: wait for a new request
            if batch:
                time.sleep((DECODE_BASE_S + DECODE_PER_REQ_S * batch) / self.speed)

    def _admit(self) -> tuple[list[Request], int, int]:
        reserved = sum(r.remaining() * self.ratio for r in self.running)
        admitted: list[Request] = []
        extend_total = cached_total = 0
        while self.waiting and len(self.running) < self.max_running:
            request = self.waiting[0]
            hits = 0
            for page in request.pages:
                if page not in self.users:
                    break
                hits += 1
            host_hits = 0
            if self.host_pages:
                for page in request.pages[hits:]:
                    if page not in self.host:
                        break
                    host_hits += 1
            matched = hits * PAGE
            held = request.input_len + request.generated  # a retracted request re-prefills both
            extend = held - matched
            evictable = PAGE * sum(1 for p in request.pages[:hits] if p in self.evictable)
            room = self._available() + PAGE * len(self.evictable) - evictable - reserved
            need = extend + request.remaining() * self.ratio
            # With nothing running the estimate of what it will generate cannot free up: a
            # request whose tokens so far fit the pool is admitted (retracted later if need be).
            alone = not self.running and extend <= room
            if need > room and not alone:
                break
            if admitted and extend_total + extend > self.max_prefill:
                break
            if not self._evict(extend, frozenset(request.pages[:hits])):
                break
            self.waiting.popleft()
            for page in request.pages:
                self.users[page] = self.users.get(page, 0) + 1
                self.evictable.pop(page, None)
            request.locked = list(request.pages)
            request.private = held - PAGE * len(request.locked)
            request.cached_tokens = matched + PAGE * host_hits
            self.input_total += request.input_len
            self.hit_total += min(request.input_len, request.cached_tokens)
            self.running.append(request)
            admitted.append(request)
            reserved += request.remaining() * self.ratio
            extend_total += extend
            cached_total += request.cached_tokens
        return admitted, extend_total, cached_total

    def _decode(self) -> None:
        if not self._evict(len(self.running)):
            self._retract()
        for request in list(self.running):
            request.generated += 1
            request.private += 1
            if request.generated >= request.max_new_tokens:
                self.running.remove(request)
                self._free(request)
                self.prompt_tokens_total += request.input_len
                self.generation_tokens_total += request.generated
                self.requests_total += 1
                request.done.set()
        self.generated.append((time.monotonic(), len(self.running)))
        self.ratio = max(MIN_RATIO, self.ratio - (INIT_RATIO - MIN_RATIO) / DECAY_STEPS)
        self.steps += 1
        if self.steps % DECODE_LOG_INTERVAL == 0:
            gauges_usage = self._used() / self.pool
            window = [n for t, n in self.generated if t >= time.monotonic() - THROUGHPUT_WINDOW_S]
            throughput = sum(window) / (THROUGHPUT_WINDOW_S * self.speed)
            self.log(
                f"Decode batch, #running-req: {len(self.running)}, #token: {self._used()}, "
                f"token usage: {gauges_usage:.2f}, cuda graph: True, "
                f"gen throughput (token/s): {throughput:.2f}, #queue-req: {len(self.waiting)}, "
            )

    def _retract(self) -> None:
        old = self.ratio
        order = sorted(self.running, key=lambda r: (r.generated, -r.input_len), reverse=True)
        retracted = []
        while order and not self._evict(RETRACT_DECODE_STEPS * len(order)):
            request = order.pop()  # the fewest output tokens, the longest input
            self.running.remove(request)
            self._free(request)
            self.waiting.appendleft(request)
            retracted.append(request)
        if not retracted:
            return
        self.retracted_total += len(retracted)
        decoded = sum(r.generated for r in self.running)
        wanted = sum(r.max_new_tokens for r in self.running) or 1
        self.ratio = max(
            MIN_RATIO, min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / wanted)
        )
        self.log(
            f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
            f"#new_token_ratio: {old:.4f} -> {self.ratio:.4f}"
        )
