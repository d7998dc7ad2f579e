"""A bounded load on one stand-in server: ``concurrency`` clients, each sending one ``/generate``
after another (input token ids, ``max_new_tokens``) until ``seconds`` have passed; then every
request still open is dropped (the server aborts it) and a summary is printed as JSON.

Run inside the node's network namespace (``python -m simfleet load`` does that), where the
server listens on its ``--host`` (127.0.0.1 by default).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MAX_CONCURRENCY = 1024
MAX_SECONDS = 3600.0
MAX_INPUT_TOKENS = 1_000_000
MAX_OUTPUT_TOKENS = 100_000
VOCAB = 150_000
MAX_TOKENS_AT_ONCE = 20_000_000


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0
    dropped: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def document(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "lock"}


def check(
    concurrency: int, input_tokens: int, output_tokens: int, shared: float, seconds: float
) -> None:
    """``ValueError`` with the reason when a bound is broken."""
    for name, value, low, high in (
        ("--concurrency", concurrency, 1, MAX_CONCURRENCY),
        ("--input-tokens", input_tokens, 1, MAX_INPUT_TOKENS),
        ("--output-tokens", output_tokens, 1, MAX_OUTPUT_TOKENS),
        ("--shared-prefix", shared, 0.0, 1.0),
        ("--seconds", seconds, 0.1, MAX_SECONDS),
    ):
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, not {value}")
    if concurrency * input_tokens > MAX_TOKENS_AT_ONCE:
        raise ValueError(
            f"--concurrency × --input-tokens must be at most {MAX_TOKENS_AT_ONCE:,} (the prompts "
            f"held in memory at once), not {concurrency * input_tokens:,}"
        )


def drive(
    host: str,
    port: int,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    shared_prefix: float = 0.0,
    seconds: float,
) -> dict[str, Any]:
    """Run the load; return the tally (requests sent, completed, dropped at the end, errors,
    tokens)."""
    check(concurrency, input_tokens, output_tokens, shared_prefix, seconds)
    deadline = time.monotonic() + seconds
    prefix = [1 + i % (VOCAB - 1) for i in range(round(input_tokens * shared_prefix))]
    tally = Tally()

    def client(number: int) -> None:
        rng = random.Random(number)
        while (left := deadline - time.monotonic()) > 0:
            ids = prefix + [rng.randrange(1, VOCAB) for _ in range(input_tokens - len(prefix))]
            body = json.dumps(
                {"input_ids": ids, "sampling_params": {"max_new_tokens": output_tokens}}
            )
            connection = http.client.HTTPConnection(host, port, timeout=left)
            with tally.lock:
                tally.sent += 1
            try:
                connection.request("POST", "/generate", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
            except TimeoutError:
                with tally.lock:
                    tally.dropped += 1
                return
            except (OSError, http.client.HTTPException) as exc:
                with tally.lock:
                    tally.errors += 1
                    tally.first_error = tally.first_error or str(exc)
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            finally:
                connection.close()
            with tally.lock:
                if response.status != 200:
                    tally.errors += 1
                    tally.first_error = tally.first_error or answer.decode(errors="replace")[:300]
                    continue
                try:
                    meta = dict(json.loads(answer).get("meta_info", {}))
                except (ValueError, AttributeError, TypeError):
                    tally.errors += 1
                    tally.first_error = tally.first_error or "an answer that is not SGLang's JSON"
                    continue
                tally.completed += 1
                tally.prompt_tokens += int(meta.get("prompt_tokens", 0))
                tally.completion_tokens += int(meta.get("completion_tokens", 0))
                tally.cached_tokens += int(meta.get("cached_tokens", 0))

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()) + 10)
    return {"seconds": seconds, "concurrency": concurrency, **tally.document()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simfleet.load", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--input-tokens", type=int, required=True)
    parser.add_argument("--output-tokens", type=int, required=True)
    parser.add_argument("--shared-prefix", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        found = drive(
            args.host,
            args.port,
            concurrency=args.concurrency,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            shared_prefix=args.shared_prefix,
            seconds=args.seconds,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
