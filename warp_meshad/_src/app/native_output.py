"""What native libraries print, held back: file descriptors pointed at a temporary file for the length of a block.

Warp's and Polyscope's C++ code write to the process's stdout / stderr (file descriptors 1 and 2) directly, past
``sys.stdout`` and ``sys.stderr``; :func:`captured_fds` catches those bytes (and Python's own writes in the block) so
the caller can decide what of it to show.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

__all__ = ["Captured", "captured_fds"]


class Captured:
    """What was written to the captured descriptors, in order (``data``, bytes), once the block has ended."""

    def __init__(self):
        self.data = b""

    @property
    def text(self) -> str:
        """``data`` decoded (UTF-8, undecodable bytes replaced)."""
        return self.data.decode("utf-8", "replace")


@contextlib.contextmanager
def captured_fds(*fds: int):
    """Point the file descriptors ``fds`` (1: stdout, 2: stderr) at one temporary file for the block.

    Python's buffered streams are flushed before and after, so their writes land on the right side. The descriptors
    are restored however the block ends; nothing captured is written anywhere (the caller writes what it keeps).

    Yields:
        A :class:`Captured`, filled when the block ends.
    """
    out = Captured()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(fd) for fd in fds]
    try:
        with tempfile.TemporaryFile() as tmp:
            for fd in fds:
                os.dup2(tmp.fileno(), fd)
            try:
                yield out
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                for fd, copy in zip(fds, saved):
                    os.dup2(copy, fd)
                tmp.seek(0)
                out.data = tmp.read()
    finally:
        for copy in saved:
            os.close(copy)
