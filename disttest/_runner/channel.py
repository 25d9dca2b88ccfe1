"""The rank channel's endpoint: where rank processes connect to the parent.

A Unix stream socket whose address does not depend on TMPDIR: on Linux an
abstract socket (a name, no file, no length limit from the temp directory's
path; gone when closed), elsewhere a socket file in a short private
directory under ``/tmp``. Each connection is a
``multiprocessing.connection.Connection`` (length-prefixed pickles). The
parent checks a per-run token in the first message, so a stray local
connection cannot pose as a rank.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import sys
import tempfile
from multiprocessing.connection import Connection

__unittest = True

__all__ = ["Endpoint", "connect"]


class Endpoint:
    """The parent's listening socket for one run (a test or a pool)."""

    def __init__(self, backlog: int) -> None:
        self.token = secrets.token_hex(16)
        self._dir: str | None = None
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if sys.platform.startswith("linux"):
                self.address = "\0disttest-" + secrets.token_hex(12)
            else:
                # NB: sun_path holds ~104 bytes; a deep TMPDIR does not fit.
                self._dir = tempfile.mkdtemp(prefix="dt-", dir="/tmp")
                self.address = os.path.join(self._dir, "s")
            self._sock.bind(self.address)
            self._sock.listen(backlog)
            self._sock.settimeout(0)
        except BaseException:
            self.close()
            raise

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self) -> Connection | None:
        """A connection that has arrived, or None; never blocks."""
        try:
            sock, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError, TimeoutError):
            return None
        sock.setblocking(True)
        return Connection(sock.detach())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def connect(address: str) -> Connection:
    """The rank's end of the channel."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return Connection(sock.detach())
