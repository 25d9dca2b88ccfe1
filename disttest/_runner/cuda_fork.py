"""Start methods and CUDA: which start method gives ranks that can use CUDA.

A child forked from a process that has initialised CUDA cannot use CUDA:
torch raises "Cannot re-initialize CUDA in forked subprocess" at the child's
first CUDA call (and the CUDA driver does not support it either). Two of
disttest's start methods fork:

- ``fork`` forks the test process itself: unusable for CUDA once the test
  process has initialised it (``torch.cuda.is_initialized()``: a CUDA tensor
  at module level, ``torch.cuda.set_device``, ``get_device_capability``...);
- ``zygote`` forks from the fork server, a fresh interpreter (started with
  ``subprocess``, so none of the test process's CUDA state reaches it, and
  it runs with ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, so that
  ``torch.cuda.is_available()`` does not poison its forks). It never
  initialises CUDA itself, but it imports the test's module: when that
  import initialises CUDA, the server refuses to fork (it answers
  ``ForkUnsafe``) and retires; the next test gets a fresh server.

Such a test's ranks start with ``spawn`` instead (a fresh interpreter per
rank, as upstream's harness does), with a warning that says why
(:data:`FELL_BACK`). disttest does not refuse the test: the fork methods are
a speed choice, never a correctness one, and the ranks of a test that
leaves CUDA alone work under ``spawn`` too. A class that ``spawn`` cannot
import by name (defined inside a function) keeps ``fork``, with a warning
(:data:`FORKED_ANYWAY`): its ranks work as long as they leave CUDA alone.

NB: ``torch.cuda.is_available()`` (and ``torch.accelerator.is_available()``)
poisons fork without initialising CUDA (it calls ``cuInit``), which public
torch API cannot see: set ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` in the test
process to avoid it there. A pool's default ``fork`` becomes ``zygote`` on a
host with CUDA devices (counted through NVML, which poisons nothing), since
its test process has most likely poisoned fork already.
"""

from __future__ import annotations

import glob
import os

from disttest._runner import fork_threads
from disttest._runner.messages import UNSAFE_CUDA, UNSAFE_THREADS
from disttest.config import ConfigError

__unittest = True

__all__ = [
    "FELL_BACK",
    "FORKED_ANYWAY",
    "NOT_IMPORTABLE",
    "NVML_CHECK_ENV",
    "PARENT_INITIALISED",
    "SERVER_INITIALISED",
    "choose",
    "chosen_by_disttest",
    "cuda_initialised",
    "no_cuda_device",
    "fell_back",
    "initialises_cuda_at_import",
    "learn_unsafe_import",
    "server_refusal",
]

#: torch's switch for an availability check through NVML, which does not poison fork.
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
PARENT_INITIALISED = "the test process has initialised CUDA (torch.cuda.is_initialized())"
SERVER_INITIALISED = "importing {module} initialises CUDA (torch.cuda.is_initialized() in the fork server after the import)"
FELL_BACK = (
    "{test}: its ranks start with 'spawn' instead of {method!r} (from {source}) (disttest): {reason}, and ranks "
    "forked after that cannot use CUDA. To choose 'spawn' yourself and silence this, set start_method = 'spawn' "
    "on {cls} or DISTTEST_START_METHOD=spawn; to keep fork's speed, initialise CUDA only inside the ranks"
)
FORKED_ANYWAY = (
    "{test}: its ranks are forked although {reason} (disttest): 'spawn' cannot import {cls} (defined inside a "
    "function), so the ranks cannot use CUDA ('Cannot re-initialize CUDA in forked subprocess'). Define the "
    "class at module level, or initialise CUDA only inside the ranks"
)

#: ``spawn`` chosen for ranks of a class a new interpreter cannot import.
NOT_IMPORTABLE = (
    "a rank started by 'spawn' is a new interpreter, which finds {cls} by importing it by name, and it cannot "
    "(defined inside a function, or in a module without a file); define the class at module level, or start "
    "its ranks with 'zygote' or 'fork'"
)

# Modules whose import initialised CUDA in a fork server (learned from its
# refusal): their tests go to ``spawn`` without asking a fresh server again.
_cuda_at_import: set[str] = set()


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA (its forks cannot use it)."""
    import torch

    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]  # torch: unannotated


_no_device: dict[int, bool] = {}  # by pid: the answer of no_cuda_device


def no_cuda_device() -> bool:
    """Whether this host surely has no CUDA device, asked without any call
    that could poison fork: no CUDA in the build, no NVIDIA driver, or NVML
    counting none. Where NVML cannot count, the answer is False (unsure),
    since ``torch.cuda.device_count`` would then ask the driver (``cuInit``).
    Remembered per process."""
    known = _no_device.get(os.getpid())
    if known is None:
        import torch

        if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]  # torch: unannotated
            known = True
        elif not (os.path.exists("/dev/nvidiactl") or glob.glob("/dev/nvidia[0-9]*")):
            known = True  # no driver: nothing could initialise a device
        else:
            from disttest import _compat

            known = _compat.nvml_device_count() == 0
        _no_device[os.getpid()] = known
    return known


def chosen_by_disttest(cls: type, source: str) -> bool:
    """Whether the start method that came from ``source`` is disttest's
    default (a base class's ``start_method``), not the user's choice."""
    if not source.endswith(".start_method"):
        return False  # the environment variable or an explicit argument
    owner = next((k for k in cls.__mro__ if "start_method" in vars(k)), None)
    return owner is not None and owner.__module__.startswith("disttest.")


def initialises_cuda_at_import(module: str) -> bool:
    """Whether importing ``module`` is known to initialise CUDA (a fork
    server refused it: :func:`learn_unsafe_import`)."""
    return module in _cuda_at_import


def learn_unsafe_import(module: str, kind: str) -> None:
    """Record what a fork server's refusal (``kind``, one of
    :data:`~.messages.UNSAFE_KINDS`) taught about importing ``module``."""
    if kind == UNSAFE_CUDA:
        _cuda_at_import.add(module)
    elif kind == UNSAFE_THREADS:
        fork_threads.learned(module)


def server_refusal(module: str) -> str | None:
    """In the fork server, after importing the test's ``module``: why it must
    not fork the test's ranks, or None."""
    return SERVER_INITIALISED.format(module=module) if cuda_initialised() else None


def fell_back(cls: type, test: str, method: str, source: str, reason: str, kind: str = UNSAFE_CUDA) -> str:
    """The warning for ranks started with ``spawn`` instead of ``method``
    (``kind``: why, one of :data:`~.messages.UNSAFE_KINDS`)."""
    if kind != UNSAFE_CUDA:
        return fork_threads.fell_back(cls, test, method, source, reason)
    return FELL_BACK.format(test=test, method=method, source=source, reason=reason, cls=cls.__name__)


def choose(method: str, cls: type, test: str, source: str, importable: bool,
           server: bool = True) -> tuple[str, str | None]:
    """The start method to use instead of ``method`` (from ``source``) so that
    the ranks of ``cls`` can use CUDA, and do not hang in OpenMP, and the
    warning to give, if any.

    ``importable``: ``spawn`` (and the fork server) can import ``cls`` by name.
    ``server``: the fork server may be chosen (False once it could not start).
    ``spawn`` for a class it cannot import is a :class:`ConfigError`.
    """
    if method == "spawn" and not importable:
        raise ConfigError("start method", method, source, NOT_IMPORTABLE.format(cls=cls.__qualname__))
    if method == "fork":
        if cuda_initialised():
            if importable:
                return "spawn", fell_back(cls, test, method, source, PARENT_INITIALISED)
            return method, FORKED_ANYWAY.format(test=test, reason=PARENT_INITIALISED, cls=cls.__qualname__)
        if importable and server and chosen_by_disttest(cls, source) and (
                not no_cuda_device() or fork_threads.parent_refusal(getattr(cls, "rank_threads", 1))
                or fork_threads.autograd_started()):
            # The test process has most likely poisoned fork already
            # (torch.cuda.is_available() does); the fork server has not.
            # (Asked without the driver: where NVML cannot count, a device
            # is assumed, since counting through the driver would poison fork.)
            # Or it runs OpenMP's pool, which ranks that keep OpenMP's threads
            # would find broken; the fork server does not. Or autograd's
            # device threads, after which a fork can run no backward pass.
            # (named so: a fallback's warning said "instead of 'zygote' (from
            # Pool.start_method)", whose value is 'fork')
            method, source = "zygote", f"disttest's fork server in place of {source} 'fork'"
    if method == "zygote" and initialises_cuda_at_import(cls.__module__):
        reason = SERVER_INITIALISED.format(module=cls.__module__)
        return "spawn", fell_back(cls, test, method, source, reason)
    if method == "zygote":
        refusal = fork_threads.known_refusal(cls)
        if refusal is not None:
            return "spawn", fork_threads.fell_back(cls, test, method, source, refusal)
    return method, None
