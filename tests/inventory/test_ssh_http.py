"""HTTP through the SSH connection: an answer cut short is an error, never a shorter answer."""

from __future__ import annotations

import http.client
import io

import pytest

from nodes import ssh


class _Socket:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def _response(data: bytes) -> http.client.HTTPResponse:
    response = http.client.HTTPResponse(_Socket(data))  # type: ignore[arg-type]
    response.begin()
    return response


def test_a_whole_answer_is_read_whole():
    body = b'{"text": " the stand-in does no inference."}'
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    assert ssh._read_at_most(_response(head + body), ssh.HTTP_BODY_MAX) == body


def test_an_answer_cut_before_its_content_length_is_an_error():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    with pytest.raises(http.client.IncompleteRead):
        ssh._read_at_most(_response(head + b'{"text": "'), ssh.HTTP_BODY_MAX)
    with pytest.raises(http.client.IncompleteRead):
        ssh._read_at_most(_response(head), ssh.HTTP_BODY_MAX)


def test_an_answer_longer_than_the_limit_is_cut_at_the_limit_without_error():
    body = b"x" * 100
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    assert ssh._read_at_most(_response(head + body), 10) == b"x" * 10
