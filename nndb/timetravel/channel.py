"""A message channel between nndb's own processes: the live run, its
checkpoints and its replicas.  Messages are JSON objects, each sent as a
4-byte big-endian length and UTF-8 text, over one end of a socketpair.
JSON, not pickle: nothing a process receives can run code."""
from __future__ import annotations

import json
import socket
import struct
from typing import Optional


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple["Channel", "Channel"]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(a), cls(b)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, obj: dict) -> bool:
        """False if the other end has gone."""
        data = json.dumps(obj).encode("utf-8")
        try:
            self.sock.sendall(struct.pack(">I", len(data)) + data)
            return True
        except OSError:
            return False

    def _exact(self, n: int) -> Optional[bytes]:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except InterruptedError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def recv(self, limit: Optional[int] = None) -> Optional[dict]:
        """The next message, or None once the other end has closed (or, with
        ``limit``, sent more bytes than that or no JSON object: a peer not yet
        trusted)."""
        head = self._exact(4)
        if head is None:
            return None
        (n,) = struct.unpack(">I", head)
        if limit is not None and n > limit:
            return None
        body = self._exact(n)
        if body is None:
            return None
        if limit is None:
            return json.loads(body.decode("utf-8"))
        try:
            msg = json.loads(body.decode("utf-8"))
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
