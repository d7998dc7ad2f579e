"""SGLang's log line format: ``[YYYY-mm-dd HH:MM:SS TPn] message`` on stderr, line by line."""

from __future__ import annotations

import os
import sys
import time


class Log:
    def __init__(self, prefix: str = "") -> None:
        self.prefix = f" {prefix}" if prefix else ""

    def __call__(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        _write(f"[{stamp}{self.prefix}] {message}\n")

    def raw(self, text: str) -> None:
        _write(text)


def _write(text: str) -> None:
    # One write per line from every process, so lines from ranks never interleave mid-line.
    os.write(sys.stderr.fileno(), text.encode())
