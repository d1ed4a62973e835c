"""Host side of the worker protocol: length-prefixed JSON frames over a byte stream.

See ``sandboxes/worker.py`` for the frame layout. A frame longer than ``max_frame`` bytes is a
protocol violation (the worker caps its output), reported as :class:`ProtocolError`.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

_HEADER = struct.Struct(">I")
WORKER_SOURCE = (Path(__file__).with_name("worker.py")).read_text(encoding="utf-8")


class ProtocolError(Exception):
    """The worker sent something that is not a frame of the protocol."""


class Channel:
    """Send requests to and read responses from one worker.

    Args:
        reader: The worker's protocol output (its stdout, or the demultiplexed Docker stream).
        send: Writes bytes to the worker's stdin and drains.
        max_frame: Largest response frame accepted (bytes).
    """

    def __init__(self, reader: asyncio.StreamReader, send: Callable[[bytes], Awaitable[None]],
                 max_frame: int):
        self.reader, self._send, self.max_frame = reader, send, max_frame

    async def send(self, obj: dict) -> None:
        """Write one frame. Raises ``ConnectionError``/``BrokenPipeError`` when the worker is gone."""
        data = json.dumps(obj).encode("utf-8")
        await self._send(_HEADER.pack(len(data)) + data)

    async def receive(self) -> dict:
        """Read one frame.

        Raises:
            asyncio.IncompleteReadError: The worker closed its output (it died).
            ProtocolError: The frame is too long or not a JSON object.
        """
        (n,) = _HEADER.unpack(await self.reader.readexactly(_HEADER.size))
        if n > self.max_frame:
            raise ProtocolError(f"worker frame of {n} bytes exceeds {self.max_frame}")
        try:
            obj = json.loads((await self.reader.readexactly(n)).decode("utf-8", "replace"))
        except json.JSONDecodeError as e:
            raise ProtocolError(f"worker frame is not JSON: {e}") from e
        if not isinstance(obj, dict):
            raise ProtocolError("worker frame is not a JSON object")
        return obj
