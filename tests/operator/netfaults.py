"""Network faults made locally, on 127.0.0.1 only: a TCP proxy that can be partitioned, and a tarpit.

``Proxy`` forwards to PostgreSQL until ``partition()``: from then on it reads nothing and sends nothing,
so the client's socket stays open and its query waits forever, as behind a dropped link (no RST, no FIN).
``heal()`` forwards again (connections made during the partition are kept waiting, new ones work).
``Tarpit`` accepts TCP connections and never answers a byte, like a host that black-holes the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class _Listening:
    """A local TCP server on 127.0.0.1 (a free port) whose connections are closed on exit."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._server.wait_closed(), 2)


class Proxy(_Listening):
    """Forwards 127.0.0.1:<port> to the server ``dsn`` names (TCP, or its unix socket)."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self.host = str(params.get("host") or "127.0.0.1")
        self.target_port = int(params.get("port") or 5432)
        self._dsn = dsn
        self.partitioned = asyncio.Event()
        super().__init__()

    def dsn(self) -> str:
        """The server's DSN pointed at this proxy."""
        return make_conninfo(self._dsn, host="127.0.0.1", port=str(self.port), hostaddr="")

    def partition(self) -> None:
        self.partitioned.set()

    def heal(self) -> None:
        self.partitioned.clear()
        for writer in self._writers:  # the links of the partition are dead for good: close them
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            if self.host.startswith("/"):
                path = f"{self.host}/.s.PGSQL.{self.target_port}"
                up_reader, up_writer = await asyncio.open_unix_connection(path)
            else:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await src.read(65536)
                if not data:
                    break
                while self.partitioned.is_set():  # hold the bytes: nothing crosses a partition
                    await asyncio.sleep(0.05)
                    if dst.is_closing():
                        return
                dst.write(data)
                await dst.drain()
        dst.close()


class Tarpit(_Listening):
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted = 0
        self.open = 0
        self.most_open = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        self.accepted += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            with contextlib.suppress(OSError, ConnectionError):
                while await reader.read(65536):
                    pass
        finally:
            self.open -= 1

    def dsn(self, password: str = "tarpit-pw") -> str:
        return f"postgresql://tenant:{password}@127.0.0.1:{self.port}/app"
