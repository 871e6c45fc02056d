"""The control channel between the engine and its workers: authenticated, pickle-free frames.

The engine listens (on loopback for one node; across nodes only on the address the operator
gives); each worker connects, and every frame either way is JSON, signed with HMAC-SHA256 under the
job's shared secret over (direction, frame number, payload). A peer that does not know the secret
cannot produce a valid first frame, so the engine drops its connection before reading anything it
says; a frame replayed, reordered or sent the other way fails the check as well. JSON, not
pickle: a message can only ever be data (a pickle that reaches a reader can run code).

Frame: 4-byte big-endian payload length, 32-byte MAC, payload.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
from typing import Any

SECRET_ENV = "HOTPATH_CLUSTER_SECRET"
MAX_FRAME = 1 << 30
_HEADER = struct.Struct(">I32s")


class ChannelError(ConnectionError):
    """The peer closed the connection, or sent a frame that fails authentication."""


def job_secret(nnodes: int) -> bytes:
    """The secret every frame is signed with: HOTPATH_CLUSTER_SECRET where set (it must be, across
    nodes: each node's processes need the same one), else a fresh random one for this job."""
    value = os.environ.get(SECRET_ENV)
    if value:
        return value.encode()
    if nnodes > 1:
        raise ValueError(f"serving across {nnodes} nodes needs {SECRET_ENV} set to the same secret on "
                         "every node: workers that cannot present it are refused")
    return secrets.token_bytes(32)


class Channel:
    """One authenticated connection; `side` is "engine" or "worker" (each signs its own direction)."""

    def __init__(self, sock: socket.socket, secret: bytes, side: str) -> None:
        self.sock = sock
        self.secret = secret
        self.side = side
        self.sent = 0
        self.received = 0
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames go at once

    def _mac(self, direction: str, number: int, payload: bytes) -> bytes:
        return hmac.new(self.secret, f"{direction}:{number}:".encode() + payload, hashlib.sha256).digest()

    def send(self, message: Any) -> None:
        self.send_encoded(encode(message))

    def send_encoded(self, payload: bytes) -> None:
        """Sends a message `encode` made (one encoding for a message every worker gets)."""
        mac = self._mac(self.side, self.sent, payload)
        self.sent += 1
        self.sock.sendall(_HEADER.pack(len(payload), mac) + payload)

    def recv(self) -> Any:
        length, mac = _HEADER.unpack(self._read(_HEADER.size))
        if length > MAX_FRAME:
            raise ChannelError(f"frame of {length} bytes refused")
        payload = self._read(length)
        peer = "worker" if self.side == "engine" else "engine"
        if not hmac.compare_digest(mac, self._mac(peer, self.received, payload)):
            raise ChannelError("frame refused: it is not signed with this job's secret")
        self.received += 1
        return json.loads(payload)

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ChannelError("the peer closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def encode(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def connect(host: str, port: int, secret: bytes, timeout: float) -> Channel:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(None)
    return Channel(sock, secret, "worker")
