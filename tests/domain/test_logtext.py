"""Log bytes become stored lines: complete lines only, cleaned, bounded, offsets exact."""

from __future__ import annotations

from nodes.domain.logtext import LineSplitter, clean


def feed_all(splitter: LineSplitter, *chunks: bytes) -> list[tuple[str | None, int]]:
    out = []
    for chunk in chunks:
        out += [(p.text, p.size) for p in splitter.feed(chunk)]
    return out


def test_only_complete_lines_are_returned_and_sizes_add_up_to_the_offset():
    splitter = LineSplitter()
    got = feed_all(splitter, b"first li", b"ne\nsecond\nthi", b"rd")
    assert got == [("first line", 11), ("second", 7)]
    assert splitter.pending == "third"
    assert feed_all(splitter, b"\n") == [("third", 6)]


def test_a_utf8_character_split_across_chunks_survives():
    splitter = LineSplitter()
    data = "température 96 GiB\n".encode()
    cut = data.index("é".encode()) + 1
    assert feed_all(splitter, data[:cut], data[cut:]) == [("température 96 GiB", len(data))]


def test_tqdm_progress_bar_keeps_its_last_state_and_colours_are_dropped():
    raw = (
        b"\rLoading safetensors checkpoint shards:   0% Completed | 0/64"
        b"\rLoading safetensors checkpoint shards:  50% Completed | 32/64"
        b"\rLoading safetensors checkpoint shards: 100% Completed | 64/64\r"
    )
    assert clean(raw) == "Loading safetensors checkpoint shards: 100% Completed | 64/64"
    assert clean(b"\x1b[32mINFO\x1b[0m:     Started server") == "INFO:     Started server"


def test_binary_and_control_bytes_become_readable():
    assert clean(b"ok \xff\xfe bytes\x00\x07 end\tx") == "ok \ufffd\ufffd bytes end\tx"


def test_a_long_line_is_cut_with_a_note():
    text = clean(b"x" * 20_000, max_chars=100)
    assert text.startswith("x" * 100) and "19900 more characters cut" in text


def test_an_endless_line_is_bounded_and_its_rest_is_consumed_not_stored():
    splitter = LineSplitter(max_line_chars=50, max_line_bytes=1000)
    first = feed_all(splitter, b"y" * 1500)
    assert len(first) == 1 and first[0][1] == 1500 and "cut" in (first[0][0] or "")
    rest = feed_all(splitter, b"y" * 300 + b"\nnext\n")
    assert rest == [(None, 301), ("next", 5)]
    assert sum(size for _, size in first + rest) == 1500 + 300 + 1 + 5
