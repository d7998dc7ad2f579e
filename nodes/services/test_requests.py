"""A test request to a ready server, from the launch page: one short ``/generate`` through the
node's SSH connection (the server's port need not be open to the panel), with its answer and
latency. SGLang's native ``/generate`` takes ``{"text", "sampling_params"}`` and answers
``{"text", "meta_info"}`` (sgl-project/sglang ``srt/entrypoints/http_server.py``); a server
started with ``--api-key`` wants it as a bearer token."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from nodes import ssh
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Launch
from nodes.services.credentials import target_for
from nodes.services.launch_flags import args_of

PROMPT = "The capital of France is"
MAX_NEW_TOKENS = 16
TIMEOUT_S = 60.0
#: The answer is cut to this many characters for the page.
SHOWN_CHARS = 2000
#: What the task's answer says it is, so a page shown another task's id says so.
KIND = "test_request"
#: What an HTTP header value may hold (visible ASCII and spaces: RFC 9110 field-value).
HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


def send(launch: Launch) -> dict[str, Any]:
    """``{"kind", "launch", "prompt", "status", "latency_ms", "answer", "tokens", "error"}``:
    the HTTP status of
    ``POST /generate`` and the time to its whole answer (ms, from the node: the SSH hop to the
    panel is not in it), the generated text, the completion tokens SGLang counted; ``error``
    (and no status) where the server did not answer."""
    flags = parse_command(args_of(launch), table(launch.node.sglang_version or DEFAULT_VERSION))
    headers = {"Content-Type": "application/json"}
    doc: dict[str, Any] = {"kind": KIND, "launch": launch.pk, "prompt": PROMPT}
    if key := flags.get("api_key"):
        if not HEADER_VALUE.fullmatch(str(key)):
            # http.client would refuse it, and its error would carry the key into the log.
            return {**doc, "error": "the server's --api-key holds characters an HTTP header "
                    "cannot carry, so no request can be authorised with it"}  # fmt: skip
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps(
        {"text": PROMPT, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}}
    ).encode()
    try:
        with ssh.pool.session(target_for(launch.node)) as conn:
            began = time.monotonic()
            status, answer = ssh.http_request(
                conn, launch.port, "POST", "/generate", body=body, headers=headers,
                timeout=TIMEOUT_S,
            )  # fmt: skip
            doc["latency_ms"] = round((time.monotonic() - began) * 1000, 1)
    except ssh.RemoteError as exc:
        return {**doc, "error": exc.message}
    doc["status"] = status
    text = answer.decode(errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("text"), str):
        doc["answer"] = parsed["text"][:SHOWN_CHARS]
        meta = parsed.get("meta_info")
        tokens = meta.get("completion_tokens") if isinstance(meta, dict) else None
        doc["tokens"] = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    else:
        doc["answer"] = text[:SHOWN_CHARS]
    return doc
