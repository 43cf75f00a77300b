"""A lossy HTTP proxy in front of gunicorn: lost answers and duplicated requests.

One request per client connection (the proxy asks gunicorn to close after
answering, and closes too). For each request it draws, from its own seeded
random generator, one fate:

- ``lost``: the request is forwarded and answered by gunicorn, and the answer
  is thrown away: the client sees its connection close with no answer, as
  when a load balancer or the network drops it after the server did the work;
- ``duplicated``: the request is sent to gunicorn twice, at once, on two
  connections (a client library or a proxy that retried on its own), and the
  client gets the first answer;
- ``passed``: forwarded once, answered once.

A client whose request cannot reach gunicorn (restarting, killed) sees its
connection closed with no answer too.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

HEAD_LIMIT = 64 * 1024
UPSTREAM_TIMEOUT = 60.0


class LossyProxy:
    def __init__(self, upstream_port: int, *, lose: float, duplicate: float, seed: int) -> None:
        self.upstream_port = upstream_port
        self.lose = lose
        self.duplicate = duplicate
        self.random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lossy-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        self._thread.start()
        self._ready.wait(10)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await read_request(reader)
            if request is None:
                return
            draw = self.random.random()
            if draw < self.lose:
                fate = "lost"
            elif draw < self.lose + self.duplicate:
                fate = "duplicated"
            else:
                fate = "passed"
            self.counts[fate] += 1
            if fate == "duplicated":
                answers = await asyncio.gather(self._forward(request), self._forward(request))
                answer = answers[0] or answers[1]
            else:
                answer = await self._forward(request)
            if answer is None:
                self.counts["unreachable"] += 1
            elif fate != "lost":
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _forward(self, request: bytes) -> bytes | None:
        """gunicorn's whole answer, or None when it could not be had."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream_port), 5
            )
        except (TimeoutError, OSError):
            return None
        try:
            writer.write(request)
            await writer.drain()
            return await asyncio.wait_for(reader.read(), UPSTREAM_TIMEOUT) or None
        except (TimeoutError, OSError):
            return None
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request, its Connection header replaced by ``close``."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head[:-4].split(b"\r\n")
    length = 0
    kept = [lines[0]]
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"connection":
            continue
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        kept.append(line)
    kept.append(b"Connection: close")
    body = await reader.readexactly(length) if length else b""
    return b"\r\n".join(kept) + b"\r\n\r\n" + body
