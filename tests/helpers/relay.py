"""A TCP relay on loopback for real network faults: cut, restored, frozen."""

from __future__ import annotations

import asyncio
import contextlib


class Relay:
    """A TCP relay 127.0.0.1:port → target that can be cut (every connection reset), restored,
    frozen (connections stay open, nothing passes: a peer that hangs), and made to hold only the
    target's answers (requests arrive and are acted on; their acknowledgements are lost for now)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.answering = asyncio.Event()
        self.answering.set()
        self.forwarded = 0  # bytes passed on from clients to the target

    def freeze(self) -> None:
        self.flowing.clear()

    def hold_answers(self) -> None:
        self.answering.clear()

    def thaw(self) -> None:
        self.flowing.set()
        self.answering.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src, dst, *gates: asyncio.Event) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    for gate in gates:
                        await gate.wait()
                    dst.write(data)
                    if dst is up_writer:
                        self.forwarded += len(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(
            pipe(reader, up_writer, self.flowing), pipe(up_reader, writer, self.flowing, self.answering)
        )
