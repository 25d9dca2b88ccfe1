"""Checkpoint test helpers: upstream's ``checkpoint_utils`` on disttest's runners.

The names of ``torch.testing._internal.distributed.checkpoint_utils``, so a
distributed-checkpoint suite ports by changing one import:

- :func:`with_temp_dir`: one temporary directory per test, shared by every
  rank (rank 0 makes it and broadcasts its path), as ``self.temp_dir``;
  removed after the test, also when the test fails.
- :func:`with_checkpoint_logging`: a logger's level set for the test and
  restored after it.
- :class:`Rot13Example` and :func:`get_test_extension_registry`: a stream
  transform extension of ``torch.distributed.checkpoint`` for tests, and a
  registry that knows it.
- :class:`ExtensionRegistry`, :class:`StreamTransformExtension`: torch's
  classes, handed on as upstream does.

Importing this module does no tensor work and changes nothing in torch.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar, cast, overload

import torch.distributed as dist

from disttest import _compat
from disttest._runner import rank as rank_mod
from disttest.pg.fake import BACKEND as MOCK_BACKEND
from disttest.support import janitor

__unittest = True

__all__ = [  # noqa: F822 (torch's classes and Rot13Example come through __getattr__)
    "ExtensionRegistry",
    "Rot13Example",
    "StreamTransformExtension",
    "get_test_extension_registry",
    "with_checkpoint_logging",
    "with_temp_dir",
]

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger(__name__)


UNKNOWN_VERSION = (
    "Rot13Example cannot read version {version!r} of the {name!r} extension, only version 1 "
    "(from the checkpoint's metadata) (disttest): the checkpoint was written by another version of it"
)
#: Backends whose ranks are simulated in one process (a broadcast reaches no peer).
SOLO_BACKENDS = frozenset({"fake", MOCK_BACKEND})


# --- the test extension --------------------------------------------------------


def _swap_case(view: memoryview, count: int) -> None:
    """Swap the case of the ASCII letters among the first ``count`` bytes, in place."""
    view[:count] = bytes(view[:count]).swapcase()


class _Rot13Writer(io.RawIOBase):
    """The stream :meth:`Rot13Example.transform_to` returns."""

    def __init__(self, output: IO[bytes]) -> None:
        super().__init__()
        self.output = output

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int | None:
        chunk = bytearray(b)  # a copy: the caller's buffer stays as it was
        _swap_case(memoryview(chunk), len(chunk))
        return self.output.write(chunk)

    def flush(self) -> None:
        self.output.flush()


class _Rot13Reader(io.RawIOBase):
    """The stream :meth:`Rot13Example.transform_from` returns."""

    def __init__(self, input: IO[bytes]) -> None:
        super().__init__()
        self.input = input

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int | None:
        view = memoryview(b).cast("B")
        readinto = getattr(self.input, "readinto", None)
        if readinto is not None:
            count = readinto(view)
        else:  # an IO[bytes] without readinto: read and copy
            data = self.input.read(len(view))
            count = None if data is None else len(data)
            if data:
                view[: len(data)] = data
        if count:
            _swap_case(view, count)
        return cast("int | None", count)

    def seekable(self) -> bool:
        return self.input.seekable()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.input.seek(offset, whence)

    def tell(self) -> int:
        return self.input.tell()


@functools.cache
def _rot13_class() -> Any:
    """Rot13Example, made when first asked for (its base is torch's)."""
    base: Any = _compat.checkpoint_extension().StreamTransformExtension

    class Rot13Example(base):  # type: ignore[misc]  # torch's class, found at run time
        """A stream transform extension for tests: it swaps the case of every ASCII
        letter of the stream (upstream's "rot13" does exactly that, so checkpoints
        written by either class read back with the other).

        Give an instance to ``FileSystemWriter(..., _extensions=[...])``; read
        back through a reader with :func:`get_test_extension_registry`. It runs
        in the rank that writes or reads, chunk by chunk.
        """

        def __init__(self, chunk_size: int = io.DEFAULT_BUFFER_SIZE) -> None:
            super().__init__()
            self._chunk_size = chunk_size

        @staticmethod
        def from_descriptor(version: str) -> Rot13Example:
            """The extension for ``version`` of the descriptor (only "1" and "1.x")."""
            if version.partition(".")[0] != "1":
                raise ValueError(UNKNOWN_VERSION.format(version=version, name=Rot13Example.registry_name()))
            return Rot13Example()

        @staticmethod
        def _rot13bytes(b: Any, count: int) -> None:
            """Swap the case of the ASCII letters among the first ``count``
            bytes of the writable buffer ``b``, in place (upstream's helper)."""
            _swap_case(memoryview(b), count)

        @staticmethod
        def registry_name() -> str:
            """The name the extension is registered and recorded under: "stream.rot13"."""
            return "stream.rot13"

        def get_descriptor(self) -> str:
            """The descriptor written into the checkpoint's metadata: "stream.rot13/1"."""
            return f"{self.registry_name()}/1"

        def transform_to(self, output: IO[bytes]) -> IO[bytes]:
            """A writable stream that writes the transform of its input to ``output``."""
            return cast(IO[bytes], _Rot13Writer(output))

        def transform_from(self, input: IO[bytes]) -> IO[bytes]:
            """A readable stream that reads ``input`` and undoes the transform."""
            return cast(IO[bytes], _Rot13Reader(input))

    # Found by pickle as this module's attribute (its __getattr__), not as a
    # local of this function: a writer that holds one goes to other processes.
    Rot13Example.__module__, Rot13Example.__qualname__ = __name__, "Rot13Example"
    return Rot13Example


def __getattr__(name: str) -> Any:
    # torch's checkpoint classes, and the one built on them, when first asked for.
    if name in ("ExtensionRegistry", "StreamTransformExtension"):
        return getattr(_compat.checkpoint_extension(), name)
    if name == "Rot13Example":
        return _rot13_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_test_extension_registry() -> Any:
    """A new ``ExtensionRegistry`` with torch's own extensions and :class:`Rot13Example`."""
    registry = _compat.checkpoint_extension().ExtensionRegistry()
    registry.register(_rot13_class())
    return registry


# --- decorators ---------------------------------------------------------------


def _has_peers() -> bool:
    """Whether a default group with real peers exists in this rank."""
    return dist.is_initialized() and dist.get_backend() not in SOLO_BACKENDS


def _make_dir() -> tuple[str, int | None]:
    """A new private (0700) directory, and its janitor token if it has one.

    In a rank process of a disttest runner it is made inside the run's own
    directory, which the test process removes however the rank ends;
    elsewhere (the test process, ranks as threads) the janitor holds it
    until :func:`_remove` (see :mod:`disttest.support.janitor`).
    """
    run_dir = rank_mod.run_dir()
    path = tempfile.mkdtemp(prefix="disttest-ckpt-", dir=run_dir)
    if run_dir is not None:
        return path, None
    return path, janitor.register(functools.partial(shutil.rmtree, path, ignore_errors=True), paths=[path])


def _remove(path: str, token: int | None) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if token is not None:
        janitor.unregister(token)


@contextlib.contextmanager
def _private_dir() -> Iterator[str]:
    """A directory of this process alone (no group, or a simulated one)."""
    path, token = _make_dir()
    try:
        yield path
    finally:
        _remove(path, token)


@contextlib.contextmanager
def _shared_dir() -> Iterator[str]:
    """A directory made by rank 0 and shared with every rank of the default
    group (collective: every rank must enter).

    Rank 0 makes it with :func:`_make_dir`. On a normal exit the ranks meet
    at a barrier before they remove it, so no rank loses it while a peer
    still reads; if the body raises, the rank removes it at once (its peers
    are being failed).
    """
    token = None
    if dist.get_rank() == 0:
        made, token = _make_dir()
        names: list[str | None] = [made]
    else:
        names = [None]
    dist.broadcast_object_list(names)
    path = names[0]
    assert path is not None, "broadcast_object_list left the temp dir's name unset"
    ok = False
    try:
        yield path
        ok = True
    finally:
        try:
            if ok and dist.is_initialized():
                dist.barrier()
        finally:
            # A failing rank process leaves it to its run's directory, which
            # the test process removes at the test's end: removed now, a peer
            # still writing there raised FileNotFoundError, reported as a
            # cause of its own (the test "errored", not "failed").
            if ok or token is not None or rank_mod.run_dir() is None:
                _remove(path, token)


@overload
def with_temp_dir(func: F) -> F: ...
@overload
def with_temp_dir(func: None = None) -> Callable[[F], F]: ...


def with_temp_dir(func: F | None = None) -> F | Callable[[F], F]:
    """Decorator: run the test with ``self.temp_dir``, a new temporary
    directory shared by every rank, removed after the test.

    With a default group (put ``@with_comms`` above this decorator) rank 0
    makes the directory and broadcasts its path, so every rank of a
    :class:`~disttest.MultiProcessTestCase`, ``DTensorTestBase`` or
    :class:`~disttest.MultiThreadedTestCase` test writes to the same one
    (collective: every rank must run the test). After a passing test the
    ranks meet at a barrier and remove it; a failing rank (thread) removes
    it at once (a rank process leaves it to its run's directory, which the test
    process removes). A rank process that is killed (timeout, fail-fast) leaves nothing
    either: the directory lives inside the test's run directory, which the
    test process removes. Without a group, or in a simulated one (fake
    comms), each process gets a directory of its own. Also usable as
    ``@with_temp_dir()``.
    """
    if func is None:
        return with_temp_dir

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _shared_dir() if _has_peers() else _private_dir() as path:
            logger.debug("disttest: temp directory for %s: %s", getattr(func, "__name__", func), path)
            self.temp_dir = path
            return func(self, *args, **kwargs)

    return cast(F, wrapper)


@overload
def with_checkpoint_logging(func: F, logger_name: str = ..., level: int = ...) -> F: ...
@overload
def with_checkpoint_logging(func: None = None, logger_name: str = ..., level: int = ...) -> Callable[[F], F]: ...


def with_checkpoint_logging(
    func: F | None = None,
    logger_name: str = "torch.distributed.checkpoint",
    level: int = logging.INFO,
) -> F | Callable[[F], F]:
    """Decorator: set the level of the logger ``logger_name`` (default
    "torch.distributed.checkpoint") to ``level`` (default INFO) for the test,
    and restore it after, also when the test fails.

    It acts in the process or thread that runs the test (each rank); NB: a
    logger is shared by the threads of a process. Also usable with
    arguments: ``@with_checkpoint_logging(level=logging.DEBUG)``.
    """
    if func is None:
        return functools.partial(with_checkpoint_logging, logger_name=logger_name, level=level)

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        target = logging.getLogger(logger_name)
        original = target.level
        target.setLevel(level)
        try:
            return func(self, *args, **kwargs)
        finally:
            target.setLevel(original)

    return cast(F, wrapper)
