"""One HTTP request whose body is sent only once the server says it wants it
(``Expect: 100-continue``, as RFC 9110 describes it), standard library only.

A server that refuses a request from its headers alone (a body over its limit: 413; a
full disk: 503) answers before the body is sent, so the client reads that answer instead
of a connection the server closed under a body it would not read. A server that says
nothing within ``wait_s`` gets the body anyway, as the RFC asks of clients.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import BinaryIO

__all__ = ["Answer", "send_expecting_continue"]

_CHUNK = 1024 * 1024
_HEAD_LIMIT = 64 * 1024  # an interim or refusing answer's status line and headers, at most

Answer = tuple[int, dict[str, str], bytes]  # status, headers (lower-case names), body


def send_expecting_continue(method: str, url: str, body: bytes | BinaryIO, size: int, headers: Mapping[str, str],
                            *, timeout_s: float, wait_s: float = 1.0) -> Answer:
    """Send ``method url`` with ``headers`` and ``Expect: 100-continue``, then ``body``
    (``size`` bytes) unless the server answered first. → the final answer. Transport
    failures raise ``OSError`` or ``http.client.HTTPException``."""
    parts = urllib.parse.urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(size), "Expect": "100-continue"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        sock = connection.sock
        early = _early_answer(sock, wait_s) if sock is not None else None
        if early is not None:
            return early
        try:
            if isinstance(body, (bytes, bytearray)):
                connection.send(bytes(body))
            else:
                while block := body.read(_CHUNK):
                    connection.send(block)
        except (BrokenPipeError, ConnectionResetError) as failed:
            # The server answered, and closed, while the body was on its way: its answer may
            # still be there to read; if not, the send's failure is what happened.
            try:
                response = connection.getresponse()
            except (OSError, http.client.HTTPException):
                raise failed from None
            raw = response.read()
            return response.status, {name.lower(): value for name, value in response.getheaders()}, raw
        response = connection.getresponse()
        raw = response.read()
        return response.status, {name.lower(): value for name, value in response.getheaders()}, raw
    finally:
        connection.close()


def _early_answer(sock: socket.socket, wait_s: float) -> Answer | None:
    """What the server said before the body: None for "100 Continue" or silence (send it),
    else its final answer, read whole."""
    if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
        readable, _, _ = select.select([sock], [], [], wait_s)
        if not readable:
            return None
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        if not data:
            raise http.client.RemoteDisconnected("the server closed the connection before answering")
        head += data
        if len(head) > _HEAD_LIMIT:
            raise http.client.LineTooLong("the server's answer before the body")
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        raise http.client.BadStatusLine(status_line) from None
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    if status == 100:
        return None
    length = int(found.get("content-length", "0") or 0)
    raw = b""
    while len(raw) < length:
        data = sock.recv(min(_CHUNK, length - len(raw)))
        if not data:
            break
        raw += data
    return status, found, raw
