"""The rank channel: one connection per rank process, one decoder in the parent.

Ranks connect to the parent's :class:`Endpoint`, a Unix stream socket whose address does not depend on TMPDIR: on Linux an
abstract socket (a name, no file, no length limit from the temp directory's
path; gone when closed), elsewhere a socket file in a short private
directory under ``/tmp``. Each connection is a
``multiprocessing.connection.Connection`` (length-prefixed pickles). The
parent checks a per-run token in the first message, so a stray local
connection cannot pose as a rank. :class:`Channel` is the parent's side of
one run (a test, or a pool): it accepts the ranks, decodes every message
they send (:mod:`.messages`) and keeps what they said.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from disttest._runner.messages import Done, Hello, Ready, Run, deliver, send
from disttest._runner.outcome import showing_locals

__unittest = True

__all__ = ["FRAME_TIMEOUT", "Channel", "Endpoint", "connect"]

#: Seconds the parent waits for the rest of a message once its first byte
#: is there: a stray local process (abstract sockets have no permissions)
#: that sends half a message cannot stall the test process.
FRAME_TIMEOUT = 5.0


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
        # Reads that wait longer fail (EAGAIN) instead of blocking for ever.
        seconds = int(FRAME_TIMEOUT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("ll", seconds, int((FRAME_TIMEOUT - seconds) * 1e6)))
        return Connection(sock.detach())

    def close(self, remove: bool = True) -> None:
        """Stop listening; with ``remove``, also remove the socket's folder
        (not from a forked copy of the parent: the parent still listens)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if remove and self._dir is not None:
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


class _Poller:
    """A poll set kept from one wait to the next, changed only where the
    objects waited on change. ``multiprocessing.connection.wait`` makes a
    selector and registers every object on each call: a pooled test waits
    a few times per rank, and that was a fifth of the parent's time."""

    def __init__(self) -> None:
        self._selector = selectors.PollSelector() if hasattr(selectors, "PollSelector") \
            else selectors.SelectSelector()
        self._objects: dict[int, Any] = {}  # fd -> what was registered for it

    def wait(self, objects: Iterable[Any], timeout: float | None) -> list[Any]:
        """The ``objects`` (each with a ``fileno()``) ready to read, waiting
        up to ``timeout`` seconds for one."""
        want: dict[int, Any] = {}
        for obj in objects:
            try:
                want[obj.fileno()] = obj
            except (OSError, ValueError):
                continue  # closed meanwhile: nothing to read
        for fd, obj in list(self._objects.items()):
            if want.get(fd) is not obj:  # gone, or its number reused by another
                self._selector.unregister(fd)
                del self._objects[fd]
        for fd, obj in want.items():
            if fd not in self._objects:
                self._selector.register(fd, selectors.EVENT_READ, obj)
                self._objects[fd] = obj
        return [key.data for key, _ in self._selector.select(timeout)]

    def clear(self) -> None:
        """Wait on nothing (a poll selector holds no descriptor of its own:
        it stays usable)."""
        for fd in self._objects:
            self._selector.unregister(fd)
        self._objects.clear()


class Channel:
    """The parent's side of the channels of one run's ``world_size`` ranks.

    ``ready[rank]``: the rank has started (None, or the outcome of a failed
    or skipped group); ``answers[rank]``: its outcome of the current test
    (``seq``; answers to an older test are dropped). With ``first_test``
    (a fresh-process run: a pool of one test), the ranks run that test as
    test 1 without being sent it: nothing travels before their answers.
    """

    def __init__(self, world_size: int, first_test: str | None = None) -> None:
        self.world_size = world_size
        self.endpoint: Endpoint | None = Endpoint(world_size)
        self.address = self.endpoint.address
        self.token = self.endpoint.token
        self.conns: dict[int, Connection] = {}
        self.ready: dict[int, Any] = {}
        self.answers: dict[int, Any] = {}
        self.seq = 1 if first_test is not None else 0
        self._pending: list[Connection] = []
        self._poller = _Poller()

    def waitables(self) -> list[Any]:
        live = [c for c in self.conns.values() if not c.closed]
        return [*([self.endpoint] if self.endpoint is not None else []), *self._pending, *live]

    def pump(self, timeout: float, also: Iterable[Any] = ()) -> None:
        """Take every message that has arrived, waiting up to ``timeout`` for
        the first one (or for one of ``also`` to be ready)."""
        waitables = self.waitables()
        if not waitables and not also:
            time.sleep(timeout)  # nothing can arrive: do not spin
            return
        ready = self._poller.wait([*waitables, *also], timeout)
        while ready:
            for obj in ready:
                if isinstance(obj, Endpoint):
                    conn = obj.accept() if obj is self.endpoint else None  # closed meanwhile
                    if conn is not None:
                        self._pending.append(conn)
                elif isinstance(obj, Connection) and obj in waitables:
                    self._receive(obj)
            waitables = self.waitables()
            ready = self._poller.wait(waitables, 0) if waitables else []

    def _receive(self, conn: Connection) -> None:
        try:
            message = conn.recv()
        except Exception:  # noqa: BLE001 (EOF: a rank that exited, seen by the launcher; or garbage)
            self._drop(conn)
            return
        if conn in self._pending and not isinstance(message, Hello):
            self._drop(conn)  # not one of our ranks
        else:
            deliver(message, self, conn)  # a message this side does not take is dropped

    def _drop(self, conn: Connection) -> None:
        if conn in self._pending:
            self._pending.remove(conn)
        conn.close()

    def on_hello(self, message: Hello, conn: Connection) -> None:
        if (conn not in self._pending or message.token != self.token
                or message.rank not in range(self.world_size) or message.rank in self.conns):
            self._drop(conn)
            return
        self._pending.remove(conn)
        self.conns[message.rank] = conn
        if len(self.conns) == self.world_size and self.endpoint is not None:
            self.endpoint.close()  # every rank is here: nobody else may connect
            self.endpoint = None

    def on_ready(self, message: Ready, conn: Connection) -> None:
        if self.conns.get(message.rank) is conn:
            self.ready[message.rank] = message.failure

    def on_done(self, message: Done, conn: Connection) -> None:
        rank = getattr(message.outcome, "rank", None)
        if message.seq == self.seq and rank is not None and self.conns.get(rank) is conn:
            self.answers[rank] = message.outcome

    def dispatch(self, test: str) -> int:
        """Send ``test`` to every rank as the next test; return its number."""
        self.seq += 1
        self.answers = {}
        for rank in self.conns:
            self.send(rank, Run(self.seq, test, showing_locals()))
        return self.seq

    def send(self, rank: int, message: object) -> None:
        conn = self.conns.get(rank)
        if conn is not None and not conn.closed:
            with contextlib.suppress(OSError):
                send(conn, message)

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        for conn in [*self._pending, *self.conns.values()]:
            conn.close()
        self._pending = []
        self._poller.clear()

    def drop_inherited(self) -> None:
        """In a process forked from the parent: close this process's copies
        of the channel's sockets (a rank keeping the listening one would let
        others connect after the parent closed it), removing nothing."""
        if self.endpoint is not None:
            self.endpoint.close(remove=False)
        for conn in [*self._pending, *self.conns.values()]:
            with contextlib.suppress(OSError):
                conn.close()
