"""Skip decorators and the TEST_SKIPS exit-code protocol.

Upstream suites skip inside a rank with ``sys.exit(TEST_SKIPS[key].exit_code)``.
disttest's own decorators raise :class:`DistSkip` (a ``unittest.SkipTest``
that carries the upstream exit code), so the same decorator skips with its
message on a plain test and in a rank. :func:`skip_for_exit_code` is the one
place that maps an exit code back to a skip; runners translate at that edge.

Every decorator that decides at call time also records its check on the
wrapper (``__disttest_skip_checks__``), so runners can decide the skip in the
parent, before starting any rank (:func:`precheck_skip`).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import os
import sys
import unittest
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._typing import F
from disttest.config import ConfigError, marked_world_size, parse_world_size
from disttest.support.devices import (
    ACCELERATOR_DIST_BACKENDS,
    accelerator_count,
    at_least_x_gpu,
    has_accelerator,
)

__unittest = True

# disttest re-exports every name listed here (see disttest/__init__.py); the
# runner's helpers (precheck_skip, backend_skip_reason, NCCL_NO_GPU,
# NCCL_NOT_BUILT) are imported from this module by name.
__all__ = [
    "TEST_SKIPS",
    "DistSkip",
    "DistTestCases",
    "TestSkip",
    "get_required_world_size",
    "import_transformers_or_skip",
    "nccl_skip_if_lt_x_gpu",
    "require_n_gpus_for_nccl_backend",
    "requires_accelerator_dist_backend",
    "requires_gloo",
    "requires_mpi",
    "requires_nccl",
    "requires_nccl_version",
    "requires_torch_feature",
    "requires_ucc",
    "requires_world_size",
    "requires_xccl",
    "skip_but_pass_in_sandcastle",
    "skip_but_pass_in_sandcastle_if",
    "skip_for_exit_code",
    "skip_if_lt_x_gpu",
    "skip_if_no_gpu",
    "skip_if_odd_worldsize",
    "skip_if_rocm",
    "skip_if_rocm_multiprocess",
    "skip_if_small_worldsize",
    "skip_if_win32",
]


class TestSkip(NamedTuple):
    """An upstream skip reason: the exit code a rank uses and its message."""

    exit_code: int
    message: str


#: Upstream's skip table: same keys, exit codes and messages.
TEST_SKIPS: dict[str, TestSkip] = {
    "backend_unavailable": TestSkip(72, "Skipped because distributed backend is not available."),
    "small_worldsize": TestSkip(73, "Skipped due to small world size."),
    "odd_worldsize": TestSkip(87, "Skipped due to odd world size."),
    "no_cuda": TestSkip(74, "CUDA is not available."),
    "multi-gpu-1": TestSkip(75, "Need at least 1 CUDA device"),
    "multi-gpu-2": TestSkip(77, "Need at least 2 CUDA devices"),
    "multi-gpu-3": TestSkip(80, "Need at least 3 CUDA devices"),
    "multi-gpu-4": TestSkip(81, "Need at least 4 CUDA devices"),
    "multi-gpu-5": TestSkip(82, "Need at least 5 CUDA devices"),
    "multi-gpu-6": TestSkip(83, "Need at least 6 CUDA devices"),
    "multi-gpu-7": TestSkip(84, "Need at least 7 CUDA devices"),
    "multi-gpu-8": TestSkip(85, "Need at least 8 CUDA devices"),
    "nccl": TestSkip(76, "c10d not compiled with NCCL support"),
    "skipIfRocm": TestSkip(78, "Test skipped for ROCm"),
    "no_peer_access": TestSkip(79, "Test skipped because no GPU peer access"),
    "generic": TestSkip(
        86, "Test skipped at subprocess level, look at subprocess log for skip reason"
    ),
    "importerror": TestSkip(88, "Test skipped due to missing import"),
    "no_accelerator": TestSkip(89, "accelerator is not available."),
}



class DistSkip(unittest.SkipTest):
    """A ``unittest.SkipTest`` that also carries upstream's exit code."""

    def __init__(self, skip: TestSkip) -> None:
        super().__init__(skip.message)
        self.exit_code = skip.exit_code
        self.message = skip.message


def skip_for_exit_code(code: object) -> TestSkip | None:
    """The :class:`TestSkip` whose exit code is ``code``, or None.

    The one mapping from upstream's ``sys.exit(code)`` skips to skips.
    Read from :data:`TEST_SKIPS` as it is now, the first entry of that code
    first, as upstream does: a suite may add its own entries or reword one
    (a table made at import turned their exits into errors).
    """
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    return next((skip for skip in list(TEST_SKIPS.values()) if skip.exit_code == code), None)


def _gpu_skip(n: int) -> TestSkip:
    return TEST_SKIPS.get(
        f"multi-gpu-{n}",
        TestSkip(TEST_SKIPS["generic"].exit_code, f"Need at least {n} CUDA devices"),
    )


class DistTestCases:
    """Feature tables, read at class level as upstream does.

    ``skip_collective[name]``: backends that lack the collective ``name``;
    ``backend_feature[name]``: backends that have the feature ``name``.
    """

    skip_collective: ClassVar[dict[str, set[str]]] = {
        "allgather_coalesced": {"nccl", "mpi", "ucc", "xccl"},
        "reduce": set(),
        "sendrecv anysource": {"nccl", "ucc", "xccl"},
        "cpu barrier": {"nccl", "ucc", "xccl"},
    }
    backend_feature: ClassVar[dict[str, set[str]]] = {
        "gpu": {"nccl", "gloo", "ucc"},
        "cuda": {"nccl", "gloo", "ucc"},
        "ddp": {"nccl", "gloo", "ucc"},
        "subgroup": {"nccl", "gloo", "ucc"},
        "plugin": set(),
    }


# --- call-time decorators ---------------------------------------------------

Check = Callable[[Sequence[Any]], "TestSkip | None"]


def _skip_when(check: Check) -> Callable[[F], F]:
    """Decorator factory: raise :class:`DistSkip` when ``check(args)`` says so.

    ``args`` are the test's positional arguments (``self`` first for a test
    method). The check is also recorded for :func:`precheck_skip`.
    """

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            skip = check(args)
            if skip is not None:
                raise DistSkip(skip)
            return func(*args, **kwargs)

        checks = getattr(func, "__disttest_skip_checks__", ())
        wrapper.__disttest_skip_checks__ = (*checks, check)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


#: The world size the test's ranks will have, while :func:`precheck_skip`
#: runs its checks in the parent (a pytest marker, ``requires_world_size``:
#: the class's own ``world_size`` is not it there).
_precheck_size: contextvars.ContextVar[int | None] = contextvars.ContextVar("disttest_precheck_size", default=None)


def precheck_skip(test: unittest.TestCase, method: Callable[..., Any],
                  world_size: int | Callable[[], int | None] | None = None) -> DistSkip | None:
    """Evaluate in the parent the skip checks recorded on ``method``, with
    ``world_size`` the size its ranks will have (or what gives it, asked
    only when the method has checks; None: the test's own ``world_size``).

    Returns the first skip that applies, or None. Runners call this before
    starting ranks so that a skip costs no process.
    """
    checks = getattr(method, "__disttest_skip_checks__", ())
    if not checks:
        return None
    token = _precheck_size.set(world_size() if callable(world_size) else world_size)
    try:
        for check in checks:
            skip = check((test,))
            if skip is not None:
                return DistSkip(skip)
    finally:
        _precheck_size.reset(token)
    return None


def _world_size_of(args: Sequence[Any], decorator: str) -> int:
    size = _precheck_size.get()
    if size is not None:
        return size
    owner = args[0] if args else None
    if owner is not None and hasattr(owner, "world_size"):
        return parse_world_size(owner.world_size, f"{type(owner).__name__}.world_size")
    raw = os.environ.get("WORLD_SIZE")
    if raw is not None:
        return parse_world_size(raw, "environment variable WORLD_SIZE", text=True)
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    raise ConfigError(
        "world size", None, decorator,
        "the test has no world_size, WORLD_SIZE is not set and no process group exists",
    )


def _backend_is_mpi() -> bool:
    # As c10d reads a backend name: "MPI" is mpi.
    return os.environ.get("BACKEND", "").strip().lower() == "mpi"


def skip_if_no_gpu(func: F) -> F:
    """Skip unless every rank can have its own accelerator device."""

    def check(args: Sequence[Any]) -> TestSkip | None:
        if not has_accelerator():
            return TEST_SKIPS["no_cuda"]
        world_size = _world_size_of(args, "skip_if_no_gpu")
        return _gpu_skip(world_size) if accelerator_count() < world_size else None

    return _skip_when(check)(func)


def skip_if_small_worldsize(func: F) -> F:
    """Skip when the world size is below 8 (unless BACKEND is mpi), as upstream."""

    def check(args: Sequence[Any]) -> TestSkip | None:
        small = _world_size_of(args, "skip_if_small_worldsize") < 8
        return TEST_SKIPS["small_worldsize"] if small and not _backend_is_mpi() else None

    return _skip_when(check)(func)


def skip_if_odd_worldsize(func: F) -> F:
    """Skip when the world size is odd (unless BACKEND is mpi)."""

    def check(args: Sequence[Any]) -> TestSkip | None:
        odd = _world_size_of(args, "skip_if_odd_worldsize") % 2 == 1
        return TEST_SKIPS["odd_worldsize"] if odd and not _backend_is_mpi() else None

    return _skip_when(check)(func)


def _gpu_count(value: Any, where: str) -> int:
    """A decorator's GPU count, checked when it is applied (a string or a
    float would fail only when the test runs, with a bare TypeError)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("GPU count", value, where, "expected an int >= 0")
    return value


def require_n_gpus_for_nccl_backend(n: int, backend: str) -> Callable[[F], F]:
    """Skip when ``backend`` is nccl and fewer than ``n`` devices exist."""
    n = _gpu_count(n, "require_n_gpus_for_nccl_backend(n=...)")

    def check(args: Sequence[Any]) -> TestSkip | None:
        return _gpu_skip(n) if backend == "nccl" and accelerator_count() < n else None

    return _skip_when(check)


def nccl_skip_if_lt_x_gpu(backend: str, x: int) -> Callable[[F], F]:
    """Skip when ``backend`` is nccl and fewer than ``x`` devices exist."""
    return require_n_gpus_for_nccl_backend(_gpu_count(x, "nccl_skip_if_lt_x_gpu(x=...)"), backend)


def skip_if_lt_x_gpu(x: int, *, allow_cpu: bool = False) -> Callable[[F], F]:
    """Skip when fewer than ``x`` accelerator devices exist.

    With ``allow_cpu=True`` the test also runs on a host with no accelerator.
    A count that is not an int >= 0 is a ``ConfigError`` where it is applied.
    """
    x = _gpu_count(x, "skip_if_lt_x_gpu(x=...)")

    def check(args: Sequence[Any]) -> TestSkip | None:
        if at_least_x_gpu(x) or (allow_cpu and not has_accelerator()):
            return None
        return _gpu_skip(x)

    return _skip_when(check)


def import_transformers_or_skip() -> Callable[[F], F]:
    """Skip when the ``transformers`` package cannot be imported.

    Unlike upstream, an ImportError raised by the test body itself is an
    error, not a skip: only the package's absence is checked.
    """

    def check(args: Sequence[Any]) -> TestSkip | None:
        found = importlib.util.find_spec("transformers") is not None
        return None if found else TEST_SKIPS["importerror"]

    return _skip_when(check)


def skip_if_rocm(func: F) -> F:
    """Skip on ROCm builds of torch."""

    def check(args: Sequence[Any]) -> TestSkip | None:
        return TEST_SKIPS["skipIfRocm"] if torch.version.hip else None

    return _skip_when(check)(func)


# --- decoration-time decorators ---------------------------------------------


def skip_but_pass_in_sandcastle_if(condition: bool, reason: str) -> Callable[[F], F]:
    """``unittest.skipIf(condition, reason)``.

    Upstream turns the skip into a pass on Meta's Sandcastle; disttest never
    hides a skip, so this is always a real skip.
    """

    def decorator(func: F) -> F:
        return unittest.skipIf(condition, reason)(func) if condition else func

    return decorator


def skip_but_pass_in_sandcastle(reason: str) -> Callable[[F], F]:
    """``unittest.skip(reason)`` (see :func:`skip_but_pass_in_sandcastle_if`)."""
    return skip_but_pass_in_sandcastle_if(True, reason)


def _backend_decorator(available: bool, name: str) -> Callable[[F], F]:
    return skip_but_pass_in_sandcastle_if(
        not available, f"c10d was not compiled with the {name} backend"
    )


def requires_gloo() -> Callable[[F], F]:
    """Skip unless c10d has the gloo backend."""
    return _backend_decorator(dist.is_available() and dist.is_gloo_available(), "Gloo")


NCCL_NOT_BUILT = "c10d was not compiled with the NCCL backend"
NCCL_NO_GPU = (
    "NCCL needs a GPU: this torch has NCCL but sees none (torch.cuda.device_count() == 0) (disttest)"
)


def nccl_skip_reason() -> str | None:
    """Why NCCL cannot run here (not built; built but no GPU visible, as on
    a CUDA build of torch on a CI runner), or None when it can."""
    if not (dist.is_available() and dist.is_nccl_available()):
        return NCCL_NOT_BUILT
    if torch.cuda.device_count() == 0:
        return NCCL_NO_GPU
    return None


#: Backend names some torch build has, beyond those this torch lists.
OTHER_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl", "hccl")


def check_backend_name(backend: object, where: str) -> None:
    """Refuse a backend name no torch knows (a typo would otherwise skip as
    "not available"): ``backend`` (from ``where``) is None, a name torch
    lists or has registered (``Backend.register_backend``), or one of
    :data:`OTHER_BACKENDS`; also per device (``"cpu:gloo,cuda:nccl"``)."""
    if backend is None:
        return
    known = {*(b.lower() for b in dist.Backend.backend_list), *OTHER_BACKENDS,
             *(str(p).lower() for p in getattr(dist.Backend, "_plugins", {}))}
    names = backend_names(backend) if isinstance(backend, str) else None
    if not names or any(n not in known for n in names):
        raise ConfigError("backend", backend, where, f"expected one of {sorted(known - {'undefined'})} "
                          "(a backend registered with torch.distributed.Backend.register_backend counts), "
                          "optionally per device ('cpu:gloo,cuda:nccl')")


def backend_names(backend: str) -> list[str] | None:
    """The backend names in ``backend`` as c10d reads it (``"gloo"``,
    ``"cpu:gloo,cuda:nccl"``), lowercased; None where c10d would refuse its
    form (a blank, a pair without its device, ``"gloo,gloo"``)."""
    if not backend or any(ch.isspace() for ch in backend):
        return None
    if ":" not in backend and "," not in backend:
        return [backend.lower()]
    pairs = [part.split(":") for part in backend.lower().split(",")]
    if any(len(pair) != 2 or not all(pair) for pair in pairs):
        return None
    return [name for _device, name in pairs]


def backend_skip_reason(backend: str | None) -> str | None:
    """Why a process group of ``backend`` cannot be made here, or None.

    Hook for every runner's backend check: an unknown or absent backend, and
    nccl without a visible GPU.
    """
    if backend is None:
        return None
    for name in backend_names(str(backend)) or [str(backend)]:
        of = "" if name == str(backend).lower() else f" (of {backend!r})"
        if name == "nccl":
            reason = nccl_skip_reason()
            if reason is not None:
                return f"Backend 'nccl'{of} is not available: {reason}"
        elif not dist.is_backend_available(name):
            return f"Backend {name!r}{of} is not available (disttest)"
    return None


def requires_nccl() -> Callable[[F], F]:
    """Skip unless c10d has the NCCL backend and a GPU is visible."""
    reason = nccl_skip_reason()
    return skip_but_pass_in_sandcastle_if(reason is not None, reason or "")


XCCL_NOT_BUILT = "c10d was not compiled with the XCCL backend"
XCCL_NO_XPU = (
    "XCCL needs an XPU: this torch has XCCL but sees none (torch.xpu.device_count() == 0) (disttest)"
)


def xccl_skip_reason() -> str | None:
    """Why XCCL cannot run here (not built; built but no XPU visible), or None when it can."""
    if not (dist.is_available() and dist.is_xccl_available()):
        return XCCL_NOT_BUILT
    if torch.xpu.device_count() == 0:
        return XCCL_NO_XPU
    return None


def requires_xccl() -> Callable[[F], F]:
    """Skip unless c10d has the XCCL backend (Intel GPUs) and an XPU is
    visible (torch 2.14's ``requires_xccl``; upstream checks the build only)."""
    reason = xccl_skip_reason()
    return skip_but_pass_in_sandcastle_if(reason is not None, reason or "")


def requires_torch_feature(feature: str) -> Callable[[F], F]:
    """Skip unless the installed torch has ``feature`` (a key of
    ``disttest._compat.TORCH_FEATURES``, e.g. ``"dist.all_gather_single"``);
    the reason names the torch version it needs (``needs torch >= 2.13``)."""
    reason = _compat.missing_feature(feature)
    return skip_but_pass_in_sandcastle_if(reason is not None, reason or "")


def requires_ucc() -> Callable[[F], F]:
    """Skip unless c10d has the UCC backend."""
    return _backend_decorator(dist.is_available() and dist.is_ucc_available(), "UCC")


def requires_mpi() -> Callable[[F], F]:
    """Skip unless c10d has the MPI backend."""
    return _backend_decorator(dist.is_available() and dist.is_mpi_available(), "MPI")


def requires_nccl_version(version: tuple[int, ...], msg: str) -> Callable[[F], F]:
    """Skip unless NCCL is present at ``version`` or newer.

    Upstream runs the test anyway on a host without CUDA; disttest skips, as
    the test cannot check what it claims there.
    """
    reason = nccl_skip_reason()
    if reason is not None:
        return skip_but_pass_in_sandcastle(reason)
    found = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # torch: unannotated
    return skip_but_pass_in_sandcastle_if(
        found < version,
        f"Requires NCCL version greater than or equal to: {version}, found: {found}, "
        f"reason: {msg}",
    )


def requires_accelerator_dist_backend(
    backends: Sequence[str] | None = None,
) -> Callable[[F], F]:
    """Skip unless one of ``backends`` (default: nccl, xccl, hccl) is usable.

    Another name is a ``ConfigError`` where it is applied (upstream's skips
    the test, every time).
    """
    if isinstance(backends, str):
        backends = [backends]  # one name, not its letters
    names = list(ACCELERATOR_DIST_BACKENDS if backends is None else backends)
    probes: dict[str, Callable[[], bool]] = {
        "nccl": lambda: nccl_skip_reason() is None,
        "xccl": lambda: bool(getattr(dist, "is_xccl_available", lambda: False)()) and has_accelerator(),
        "hccl": lambda: hasattr(torch, "hpu") and has_accelerator(),
    }
    unknown = [b for b in names if b not in probes]
    if unknown or not names:
        raise ConfigError("backends", backends, "requires_accelerator_dist_backend(backends=...)",
                          f"expected some of {sorted(probes)}, the accelerator backends it can probe")
    ok = dist.is_available() and any(probes.get(b, lambda: False)() for b in names)
    return skip_but_pass_in_sandcastle_if(
        not ok, f"No accelerator communication backend available among {names}"
    )


def skip_if_rocm_multiprocess(func: F) -> F:
    """Skip on ROCm builds of torch (decided at decoration time)."""
    return unittest.skipIf(bool(torch.version.hip), TEST_SKIPS["skipIfRocm"].message)(func)


def skip_if_win32() -> Callable[[F], F]:
    """Skip on Windows."""
    return skip_but_pass_in_sandcastle_if(
        sys.platform == "win32", "This unit test case is not supported on Windows platform"
    )


def requires_world_size(n: int, *, allow_cpu: bool = False) -> Callable[[F], F]:
    """Run the test with ``n`` ranks; skip with fewer than ``n`` devices.

    The runners read the recorded size (:func:`get_required_world_size`).
    With ``allow_cpu=True`` a host without accelerators runs the test too
    (upstream always skips there).
    """
    n = parse_world_size(n, "requires_world_size(n)")

    def decorator(func: F) -> F:
        func._required_world_size = n  # type: ignore[attr-defined]
        # Kept apart: the pytest plugin writes a marker's size over the one above.
        func.__disttest_requires_world_size__ = n  # type: ignore[attr-defined]
        available = accelerator_count()
        runs = available >= n or (allow_cpu and available == 0)
        return unittest.skipUnless(runs, f"requires {n} GPUs, found {available}")(func)

    return decorator


def get_required_world_size(obj: Any, default: int) -> int:
    """The world size recorded by :func:`requires_world_size` on ``obj``'s
    current test method (named by its ``_current_test_name()`` where it has
    one, else ``_testMethodName``), else ``default``: also for an object
    that is not a test case, as upstream's."""
    current = getattr(obj, "_current_test_name", None)
    name = current() if callable(current) else getattr(obj, "_testMethodName", None)
    marked = marked_world_size(type(obj), name) if isinstance(name, str) else None
    if marked is not None:
        return marked
    method = getattr(obj, name, None) if isinstance(name, str) else None
    value = getattr(method, "_required_world_size", None)
    return default if value is None else int(value)
