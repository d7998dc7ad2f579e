"""Turn the bytes of a server log into stored lines: whole lines only, readable, bounded.

A log file is read from a byte offset; only complete lines (ending in ``\\n``) are returned, each
with its size in bytes, so the caller can store lines and advance the offset in one step and a
restart resumes exactly where the record ends (no gap, no duplicate). A line is cleaned the way a
terminal would show it: ANSI colour codes dropped, a ``\\r`` progress bar (tqdm) reduced to its
last state, bytes that are not UTF-8 replaced, other control characters removed, and a line
longer than ``max_line_chars`` cut with a note of how much was cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# CSI sequences (colours, cursor moves), OSC sequences (titles, links) and two-byte escapes.
_ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
DEFAULT_MAX_LINE_CHARS = 16000


@dataclass(frozen=True)
class Piece:
    """``size`` bytes of the file consumed; ``text`` is the stored line, or ``None`` for the
    dropped tail of an over-long line (consumed, nothing to store)."""

    text: str | None
    size: int


def clean(raw: bytes, max_chars: int = DEFAULT_MAX_LINE_CHARS) -> str:
    """One physical line (without its ``\\n``) as a terminal would last show it."""
    raw = _ANSI.sub(b"", raw.rstrip(b"\r"))
    if b"\r" in raw:
        segments = [s for s in raw.split(b"\r") if s.strip()]
        raw = segments[-1] if segments else b""
    text = _CONTROL.sub("", raw.decode("utf-8", errors="replace")).rstrip()
    if len(text) > max_chars:
        text = f"{text[:max_chars]} … [{len(text) - max_chars} more characters cut]"
    return text


class LineSplitter:
    """Feed it chunks of the file; it returns the complete lines as ``Piece`` objects.

    ``max_line_bytes`` bounds memory: a line that grows past it without a newline is stored
    cut, and the rest of that physical line is consumed without being kept.
    """

    def __init__(
        self, max_line_chars: int = DEFAULT_MAX_LINE_CHARS, max_line_bytes: int = 256 * 1024
    ) -> None:
        self.max_line_chars = max_line_chars
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._skipping = False

    @property
    def pending(self) -> str:
        """The incomplete last line as it would show now (a progress bar still moving)."""
        return "" if self._skipping else clean(bytes(self._buffer[-4096:]), self.max_line_chars)

    def feed(self, data: bytes) -> list[Piece]:
        self._buffer += data
        pieces: list[Piece] = []
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end < 0:
                break
            raw = bytes(self._buffer[start:end])
            size = end + 1 - start
            if self._skipping:
                pieces.append(Piece(None, size))
                self._skipping = False
            else:
                pieces.append(Piece(clean(raw, self.max_line_chars), size))
            start = end + 1
        del self._buffer[:start]
        if len(self._buffer) > self.max_line_bytes:
            size = len(self._buffer)
            if self._skipping:
                pieces.append(Piece(None, size))
            else:
                text = clean(bytes(self._buffer), self.max_line_chars)
                pieces.append(Piece(f"{text} … [line longer than {size} bytes cut]", size))
                self._skipping = True
            self._buffer.clear()
        return pieces
