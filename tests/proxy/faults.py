"""A fault-injecting TCP relay for adversity tests (in the spirit of asyncpg's ``_testbase/fuzzer.py``).

It listens on a loopback port and relays to a target, in a thread with its own event loop. Faults:
``delay`` each chunk, ``cut_after`` N bytes (client to target) on new connections, ``kill_all()`` current
connections abruptly (RST). Slow readers are raw sockets with a small receive buffer (see the tests).
``openings`` records the first 8 bytes each connection sent: the request code that opened it (startup,
SSLRequest or a CancelRequest in the clear).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator


class FaultyRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.delay = 0.0
        self.cut_after: int | None = None
        self.openings: list[bytes] = []
        self._conns: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="faulty-relay", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._conns.update((writer, up_writer))
        budget = [self.cut_after]
        first = [True]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, upward: bool) -> None:
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    if upward and first[0]:
                        first[0] = False
                        self.openings.append(data[:8])
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    if upward and budget[0] is not None:
                        if len(data) >= budget[0]:
                            dst.write(data[: budget[0]])
                            await dst.drain()
                            _abort(dst)
                            _abort(writer)
                            return
                        budget[0] -= len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        self._conns.difference_update((writer, up_writer))

    def kill_all(self) -> None:
        def kill() -> None:
            for w in list(self._conns):
                _abort(w)
            self._conns.clear()

        self.loop.call_soon_threadsafe(kill)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for w in list(self._conns):
                _abort(w)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@contextlib.contextmanager
def faulty_relay(host: str, port: int) -> Iterator[FaultyRelay]:
    relay = FaultyRelay(host, port)
    try:
        yield relay
    finally:
        relay.close()
