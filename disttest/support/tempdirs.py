"""Temporary directories shared by the ranks of a test, and rank temp files.

``initialize_temp_directories`` makes a private (0700) directory with
``barrier/``, ``test_dir/`` and ``init_dir/`` inside, and publishes it to the
ranks as upstream does, through ``TEMP_DIR`` and ``INIT_METHOD`` in the
environment (upstream suites read those variables). Only the process that
made a directory removes it: in ``cleanup_temp_dir`` or, as a backstop, when
the process ends, also by SIGTERM or SIGKILL (:mod:`disttest.support.janitor`
holds it until then), so a forked rank never deletes its parent's directory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator

import torch.distributed as dist

from disttest.config import ConfigError
from disttest.support import janitor

__unittest = True

__all__ = [
    "FILE_SCHEMA",
    "cleanup_temp_dir",
    "initialize_temp_directories",
    "rank_temp_file",
]

FILE_SCHEMA = "file://"
_SUBDIRS = ("barrier", "test_dir", "init_dir")

# (owner pid, path, janitor token) of every directory made here and not yet
# removed. The upstream API (initialize / cleanup with no handle) needs this registry.
_created: list[tuple[int, str, int]] = []


def initialize_temp_directories(init_method: str | None = None) -> str:
    """Make a private temp directory for the ranks and publish it.

    Sets ``TEMP_DIR`` to the new directory and ``INIT_METHOD`` to
    ``init_method`` or a ``file://`` rendezvous file inside it. Returns the
    directory's path. Call it in the parent before starting ranks.
    """
    path = tempfile.mkdtemp(prefix="disttest-")  # mkdtemp makes it 0700
    for sub in _SUBDIRS:
        os.mkdir(os.path.join(path, sub), 0o700)
    token = janitor.register(functools.partial(shutil.rmtree, path, ignore_errors=True), paths=[path])
    _created.append((os.getpid(), path, token))
    os.environ["TEMP_DIR"] = path
    os.environ["INIT_METHOD"] = init_method or (
        FILE_SCHEMA + os.path.join(path, "init_dir", "shared_init_file")
    )
    return path


def cleanup_temp_dir() -> None:
    """Remove every directory this process made with
    :func:`initialize_temp_directories`, and unset the variables that point
    into them."""
    pid = os.getpid()
    mine = [entry for entry in _created if entry[0] == pid]
    for entry in mine:
        _created.remove(entry)
        _, path, token = entry
        shutil.rmtree(path, ignore_errors=True)
        janitor.unregister(token)
        if os.environ.get("TEMP_DIR") == path:
            del os.environ["TEMP_DIR"]
        if path in os.environ.get("INIT_METHOD", ""):
            del os.environ["INIT_METHOD"]


#: The run folder of the test this rank process runs (its launcher's, which
#: the test process removes however the rank ends), set by the runner in
#: each rank process it starts.
_run_folder: list[str] = []


def use_run_folder(path: str | None) -> str | None:
    """Hook for the runners: ``path`` is this rank process's run folder,
    where :func:`rank_temp_file` makes its file (None: none); return the
    one before. (A rank process is the runner's: nothing else runs in it
    before; ``run_rank`` puts the one before back.)"""
    previous = _run_folder[0] if _run_folder else None
    _run_folder[:] = [] if path is None else [path]
    return previous


def _rank_file_folder() -> str | None:
    """Where rank 0 makes a :func:`rank_temp_file`: ``TEMP_DIR`` (upstream's
    folder, which must exist), else the rank process's run folder, else the
    system's temp folder."""
    folder = os.environ.get("TEMP_DIR")
    if folder:
        if not os.path.isdir(folder):
            raise ConfigError("temp folder", folder, "TEMP_DIR (the environment)",
                              "it is not a folder; unset it, or call initialize_temp_directories() "
                              "in the test process before the ranks start")
        return folder
    return _run_folder[0] if _run_folder and os.path.isdir(_run_folder[0]) else None


@contextlib.contextmanager
def rank_temp_file() -> Iterator[str]:
    """A temp file made by rank 0 and shared with every rank of the default
    group (collective: every rank must enter).

    The name travels by ``broadcast_object_list``. On a normal exit the ranks
    meet at a barrier before rank 0 removes the file, so no rank loses it
    while still reading; if the body raises, rank 0 removes it at once. In a
    rank process the file is in the test's run folder (unless ``TEMP_DIR``
    names one), so it goes with the test also when rank 0 dies in the body.
    """
    folder, held = _rank_file_folder(), None
    if dist.get_rank() == 0:
        if folder is None:
            # No run folder (rank threads): a folder of its own, which the
            # janitor removes should the test process end first (a rank thread
            # that hangs in the body never reaches the finally below).
            folder = tempfile.mkdtemp(prefix="disttest-rank-")
            held = janitor.register(functools.partial(shutil.rmtree, folder, ignore_errors=True), paths=(folder,))
        fd, name = tempfile.mkstemp(prefix="disttest-rank-", dir=folder)
        os.close(fd)
        names: list[str | None] = [name]
    else:
        names = [None]
    dist.broadcast_object_list(names)
    shared = names[0]
    assert shared is not None
    ok = False
    try:
        yield shared
        ok = True
    finally:
        if ok:
            dist.barrier()
        if dist.get_rank() == 0:
            with contextlib.suppress(FileNotFoundError):
                os.remove(shared)
            if held is not None and folder is not None:
                janitor.unregister(held)
                shutil.rmtree(folder, ignore_errors=True)
