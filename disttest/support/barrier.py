"""A file-based barrier between rank processes, and its file lock.

Works in ``TEMP_DIR`` (see :mod:`disttest.support.tempdirs`) without a process group,
as upstream's ``Barrier`` does: each process writes the barrier's number to
a file named by its pid and waits until enough files reach that number.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

import torch.distributed as dist

from disttest.config import parse_timeout, parse_world_size

__unittest = True

__all__ = ["BARRIER_TIMEOUT", "Barrier", "BarrierTimeout", "lock"]

NO_TEMP_DIR = (
    "TEMP_DIR is not set (disttest): call disttest.initialize_temp_directories() "
    "in the parent before starting ranks"
)
BARRIER_TIMEOUT = (
    "barrier #{barrier_id} timed out after {timeout}s (disttest): "
    "{arrived} of {expected} ranks arrived (pids {pids})"
)


class BarrierTimeout(RuntimeError):
    """Not enough ranks reached a :class:`Barrier` in time.

    Fields: ``barrier_id``, ``timeout``, ``arrived``, ``expected``, ``pids``
    (of the processes that arrived).
    """

    def __init__(
        self, barrier_id: int, timeout: float, arrived: int, expected: int, pids: list[int]
    ) -> None:
        self.barrier_id = barrier_id
        self.timeout = timeout
        self.arrived = arrived
        self.expected = expected
        self.pids = pids
        super().__init__(
            BARRIER_TIMEOUT.format(
                barrier_id=barrier_id, timeout=timeout, arrived=arrived,
                expected=expected, pids=", ".join(map(str, pids)) or "none",
            )
        )


def _temp_dir() -> str:
    path = os.environ.get("TEMP_DIR")
    if not path:
        raise RuntimeError(NO_TEMP_DIR)
    return path


@contextlib.contextmanager
def lock() -> Iterator[None]:
    """An exclusive lock on ``$TEMP_DIR/lockfile`` shared by all ranks."""
    with open(os.path.join(_temp_dir(), "lockfile"), "w") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class Barrier:
    """A barrier across processes through files in ``$TEMP_DIR/barrier``.

    ``init()`` clears it (call once in the parent, after
    ``initialize_temp_directories``); ``sync()`` waits in each rank.
    """

    barrier_id = 0
    poll_interval = 0.02

    @classmethod
    def init(cls) -> None:
        """Reset the barrier count and remove every arrival file."""
        cls.barrier_id = 0
        barrier_dir = os.path.join(_temp_dir(), "barrier")
        for name in os.listdir(barrier_dir):
            os.unlink(os.path.join(barrier_dir, name))

    @classmethod
    def sync(cls, wait_for: int | None = None, timeout: float = 10) -> None:
        """Wait until ``wait_for`` processes (default: the world size) arrive.

        Raises :class:`BarrierTimeout` (a ``RuntimeError``) after ``timeout``
        seconds, saying how many arrived; a ``wait_for`` that is not an
        integer >= 1 is a :class:`~disttest.ConfigError` before anything is written.
        """
        timeout = parse_timeout(timeout, "Barrier.sync(timeout=...)")
        expected = (dist.get_world_size() if wait_for is None
                    else parse_world_size(wait_for, "Barrier.sync(wait_for=...)"))
        cls.barrier_id += 1
        barrier_dir = os.path.join(_temp_dir(), "barrier")
        with lock():
            with open(os.path.join(barrier_dir, str(os.getpid())), "w") as f:
                f.write(str(cls.barrier_id))
        deadline = time.monotonic() + timeout
        while True:
            arrived = cls._arrived(barrier_dir)
            if len(arrived) >= expected:
                return
            if time.monotonic() > deadline:
                raise BarrierTimeout(cls.barrier_id, timeout, len(arrived), expected, arrived)
            time.sleep(cls.poll_interval)

    @classmethod
    def _arrived(cls, barrier_dir: str) -> list[int]:
        pids = []
        with lock():
            for name in os.listdir(barrier_dir):
                if not name.isdigit():
                    continue  # not an arrival (named by a pid): another's file
                with open(os.path.join(barrier_dir, name)) as f:
                    reached = f.read().strip()
                if reached.isdigit() and int(reached) >= cls.barrier_id:
                    pids.append(int(name))
        return sorted(pids)
