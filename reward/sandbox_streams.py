"""What the host reads from a sandbox, read so that no program can block it or make it hold much memory.

- `FrameReader` takes length-prefixed frames (`reward/sandbox_codec.py`) from a
  socket a program may hold, never blocking: the host waits on the run's
  deadline, not on the socket, so a program that sends part of a frame and
  sleeps is killed at its deadline like any other.
- `output_matches` compares an `io` run's stdout with the expected output as a
  stream: it stops at the first differing line and reads at most `IO_SLACK`
  bytes more than the expected output holds.
"""

from __future__ import annotations

import codecs
import os
import socket
import struct
from collections.abc import Iterable, Iterator

from reward.sandbox_codec import MAX_BYTES, CodecError, loads

IO_SLACK = 1 << 16  # output bytes read past the expected output's length (trailing whitespace) before it fails
CHUNK = 1 << 16


class FrameReader:
    """Frames from a non-blocking socket; a partial frame waits for more bytes (or the run's deadline)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = bytearray()
        sock.setblocking(False)

    def read(self) -> tuple[list[dict], bool]:
        """The frames complete so far, and whether the peer has closed its end.

        Raises:
          CodecError: a frame over the codec's size limit or not a JSON object.
        """
        closed = False
        while True:
            try:
                chunk = self.sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            self.buffer += chunk
            if len(self.buffer) > MAX_BYTES + 4:
                raise CodecError(f"message over {MAX_BYTES} bytes")
        frames = []
        while len(self.buffer) >= 4:
            (size,) = struct.unpack(">I", self.buffer[:4])
            if size > MAX_BYTES:
                raise CodecError(f"message over {MAX_BYTES} bytes")
            if len(self.buffer) < 4 + size:
                break
            obj = loads(bytes(self.buffer[4:4 + size]))
            del self.buffer[:4 + size]
            if type(obj) is not dict:
                raise CodecError("a message must be a JSON object")
            frames.append(obj)
        return frames, closed


def normalize(text: str) -> list[str]:
    """Lines with trailing whitespace stripped and blank lines at the end removed."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def output_matches(chunks: Iterable[bytes], expected: str, slack: int = IO_SLACK) -> bool:
    """`normalize(output) == normalize(expected)` for output given as byte chunks, read only as far as needed.

    Output longer than the expected output by more than `slack` bytes fails unread.
    """
    want = normalize(expected)
    budget = len(expected.encode("utf-8", "surrogatepass")) + slack
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending, seen = "", 0
    for chunk in chunks:
        budget -= len(chunk)
        if budget < 0:
            return False
        *lines, pending = (pending + decoder.decode(chunk)).split("\n")
        for line in lines:
            if line.rstrip() != (want[seen] if seen < len(want) else ""):
                return False
            seen += 1
    pending += decoder.decode(b"", final=True)
    if pending.rstrip() != (want[seen] if seen < len(want) else ""):
        return False
    return seen + 1 >= len(want)


def fd_chunks(fd: int) -> Iterator[bytes]:
    """A file's bytes from its start, a chunk at a time, read only as the consumer asks for them."""
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        offset += len(chunk)
        yield chunk
