"""Uploads past their limit are refused before the panel reads them (found by an adversarial
pass: ``/diagnose/`` took in a 300 MiB upload whole, then said it was too big). Against the
real ASGI panel, over raw sockets, because the point is what the server reads."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.urls import reverse

from controlpanel.body_limit import FORM_ALLOWANCE, limit_for
from nodes.forms.exchange import ImportForm
from nodes.forms.launches import BundleUploadForm

MiB = 2**20


def _connect(panel) -> socket.socket:
    address = urlsplit(panel.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=60)
    return sock


def _answer(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def test_a_declared_size_over_the_limit_is_refused_before_the_body_is_sent(panel):
    sock = _connect(panel)
    sock.sendall(
        b"POST /diagnose/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=x\r\n"
        + f"Content-Length: {300 * MiB}\r\n\r\n".encode()
    )
    # Nothing of the 300 MiB is sent: the answer comes to the headers alone.
    answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"This request is 300 MiB: at most 64 MiB is read here. Nothing was kept." in answer


def test_a_body_without_a_declared_size_stops_being_read_past_the_limit(panel):
    sock = _connect(panel)
    sock.sendall(
        b"POST /diagnose/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (MiB, b"x" * MiB)
    sent = 0
    try:
        while sent < 300:
            sock.sendall(chunk)
            sent += 1
    except (BrokenPipeError, ConnectionResetError):
        pass  # the panel closed the connection: what is asserted below
    answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"at most 64 MiB is read here" in answer
    assert sent < 300  # it stopped reading long before the end


def test_the_limits_are_the_forms_own():
    for url, form in (
        (reverse("nodes:bundle-diagnose"), BundleUploadForm),
        (reverse("nodes:profiles-import"), ImportForm),
    ):
        limit = limit_for(url, settings.REQUEST_BODY_LIMITS, settings.REQUEST_BODY_MAX_BYTES)
        assert limit - FORM_ALLOWANCE == form.MAX_BYTES
