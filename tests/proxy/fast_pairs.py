"""A C engine's connection between two socket pairs, for tests on literal bytes: ``client`` and ``server`` are
the test's ends (what the client sends and reads; what PostgreSQL would read and send)."""

from __future__ import annotations

import socket

from proxy import protocol as p
from proxy.fastrelay import FastRelay
from proxy.handoff import Adoption


class SocketPairs:
    """One connection ``conn_id`` adopted by ``fast`` with ``adoption``; closed by ``close``."""

    def __init__(self, fast: FastRelay, conn_id: int, adoption: Adoption) -> None:
        self.fast, self.id = fast, conn_id
        self.client, client_fd = socket.socketpair()
        self.server, server_fd = socket.socketpair()
        self._fds = (client_fd, server_fd)
        fast.adopt(conn_id, client_fd.fileno(), server_fd.fileno(), p.PG_MAX_MESSAGE, adoption)

    @staticmethod
    def read(sock: socket.socket, quiet: float = 0.2) -> bytes:
        """What arrives until nothing more comes for ``quiet`` seconds (the first byte waits up to 5 s)."""
        out = b""
        while True:
            sock.settimeout(5 if not out else quiet)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return out
            if not chunk:
                return out
            out += chunk

    def close(self) -> None:
        self.fast.release(self.id)
        for sock in (self.client, self.server, *self._fds):
            sock.close()
