"""What disttest's pytest plugin does beyond options and markers.

- Plain test functions as distributed tests: a function marked
  ``@pytest.mark.world_size(n)`` runs in ``n`` ranks, each with the default
  process group made (threads over the ``threaded`` backend by default;
  ``@pytest.mark.world_size(n, mode="processes")``: forked processes over
  gloo). The fixtures ``rank`` and ``world_size`` give each rank its place.
- The report header: torch version, start method, timeout.
- pytest-xdist: each worker sees its own slice of the GPUs
  (``CUDA_VISIBLE_DEVICES``), so two workers never share one.
- ``@pytest.mark.gpu(count=1)``: a test that needs CUDA and ``count`` GPUs
  is skipped, saying why, where this process sees fewer (devices counted
  through NVML, which does not initialise CUDA or poison fork).

``disttest.pytest_plugin`` registers these; this module holds the logic.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import unittest
import warnings
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from disttest.config import ConfigError, default_timeout, parse_world_size

__unittest = True

__all__ = [
    "ASYNC_FUNCTION",
    "CAPTURE_FIXTURES",
    "CAPTURE_IN_PROCESSES",
    "FIXTURE_USES_RANK",
    "FUNCTION_MODES",
    "GPU_NONE_VISIBLE",
    "GPU_NO_CUDA_BUILD",
    "GPU_TOO_FEW",
    "RANK_FIXTURES",
    "RETURNED_AWAITABLE",
    "gpu_count",
    "gpu_skip_reason",
    "header_line",
    "is_async",
    "rank_fixture_users",
    "run_function",
    "xdist_device_slice",
    "xdist_visible_devices",
]

#: How a marked plain function's ranks run.
FUNCTION_MODES = ("threads", "processes")
#: Fixtures whose values a rank supplies (placeholders outside ranks).
RANK_FIXTURES = ("rank", "world_size")
#: The rank fixtures' value outside a rank (a function not marked
#: ``world_size`` that asks for ``rank``).
NOT_IN_A_RANK = -1

BAD_MODE = "expected one of {modes}"
#: An ``async def`` function marked ``world_size``: nothing would await it.
ASYNC_FUNCTION = ("{where} is an async def function: disttest calls a world_size-marked function in each rank "
                  "and cannot await it (disttest); make it a def that runs its coroutine (asyncio.run)")
#: A fixture of a marked function that asks for a rank fixture: fixtures are made once, in the test process.
FIXTURE_USES_RANK = ("{where}: the fixture(s) {fixtures} ask for rank or world_size, but fixtures are made once, "
                     "in the test process, where they are -1 (disttest); read rank and world_size in the test "
                     "function itself")
#: Capture fixtures asked for by a function whose ranks are processes (they see the test process only).
CAPTURE_IN_PROCESSES = ("{where}: the fixture(s) {fixtures} capture the test process's output and logs, but "
                        "mode='processes' runs the function in rank processes, which they do not see (disttest); "
                        "use mode='threads', or check what a rank prints in the failure report")
#: The fixtures that capture the test process's output or logs.
CAPTURE_FIXTURES = ("capsys", "capsysbinary", "capfd", "capfdbinary", "caplog", "capteesys")
#: A marked function that returned an awaitable in a rank.
RETURNED_AWAITABLE = ("{name} returned {what} in a rank, which nothing awaits: its body did not run (disttest); "
                      "make it a def that runs its coroutine (asyncio.run)")
#: A processes-mode function where the start method says ``spawn``: its ranks fork (a warning).
FORKED_NOT_SPAWNED = ("{name}: {where} asks for 'spawn', but a world_size-marked function's ranks are forked "
                      "(disttest): its fixtures' values and the function itself need not pickle; use a "
                      "MultiProcessTestCase to spawn them")
#: Why a test marked ``gpu`` is skipped: a torch built without CUDA,
GPU_NO_CUDA_BUILD = "CUDA is not available (torch {version}, a build without CUDA) (disttest)"
#: no GPU visible to this process (none on the host, or CUDA_VISIBLE_DEVICES hides them),
GPU_NONE_VISIBLE = "CUDA is not available (torch {version} sees no GPU{visible}) (disttest)"
#: fewer GPUs than the marker asks for.
GPU_TOO_FEW = "needs {count} GPUs, this process sees {found} (torch {version}{visible}) (disttest)"


def header_line(environ: Mapping[str, str] | None = None, set_by: Mapping[str, str] | None = None) -> str:
    """One line for pytest's report header: torch, start method, timeout.

    ``set_by``: the option that set a variable (``--disttest-timeout`` sets
    ``DISTTEST_TIMEOUT``), named as the value's source in its place.
    """
    import torch

    env = os.environ if environ is None else environ
    method = env.get("DISTTEST_START_METHOD") or "class default (zygote; pool: fork)"
    try:
        seconds = default_timeout(env)
        source = next((f" ({(set_by or {}).get(name, name)})"
                       for name in ("DISTTEST_TIMEOUT", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT")
                       if (env.get(name) or "").strip()), " (default)")
        timeout = f"{seconds}s{source}"
    except ConfigError as e:
        timeout = f"invalid: {e}"
    return f"disttest: torch {torch.__version__}, start method {method}, timeout {timeout}"


def gpu_count(marker_args: Sequence[Any], marker_kwargs: Mapping[str, Any], where: str) -> int:
    """The GPUs a ``gpu`` marker asks for (``gpu``, ``gpu(2)``, ``gpu(count=2)``),
    checked: anything else given to it (``gpu(cuont=4)``, two counts) is an error."""
    extra = [repr(a) for a in marker_args[1 if "count" not in marker_kwargs else 0:]]
    extra += [f"{k}=" for k in marker_kwargs if k != "count"]
    if extra:
        raise ConfigError("gpu marker", ", ".join(extra), where, "takes one count (gpu(2) or gpu(count=2))")
    raw = marker_kwargs.get("count", marker_args[0] if marker_args else 1)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ConfigError("GPU count", raw, where, "expected a whole number of at least 1")
    return raw


def gpu_skip_reason(count: int = 1, environ: Mapping[str, str] | None = None) -> str | None:
    """Why a test that needs ``count`` GPUs cannot run in this process, or None.

    Counts through ``torch.cuda.device_count`` (NVML where it answers), which
    neither initialises CUDA nor poisons a later fork.
    """
    import torch

    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    visible = f", CUDA_VISIBLE_DEVICES={raw!r}" if raw is not None else ""
    if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]  # torch: unannotated
        return GPU_NO_CUDA_BUILD.format(version=torch.__version__)
    found = torch.cuda.device_count()
    if found == 0:
        return GPU_NONE_VISIBLE.format(version=torch.__version__, visible=visible)
    if found < count:
        return GPU_TOO_FEW.format(count=count, found=found, version=torch.__version__, visible=visible)
    return None


def function_mode(kwargs: Mapping[str, Any], where: str) -> str:
    """The ``mode=`` of a ``world_size`` marker on a plain function, checked."""
    mode = kwargs.get("mode", "threads")
    if mode not in FUNCTION_MODES:
        raise ConfigError("mode", mode, where, BAD_MODE.format(modes=FUNCTION_MODES))
    return str(mode)


class _Reraise(unittest.TestResult):
    """Keeps the first error, failure or skip of a wrapped run."""

    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None
        self.skip_reason: str | None = None

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's name
        self.error = self.error or err[1]

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self.error = self.error or err[1]

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self.skip_reason = reason


def _call(func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    import torch.distributed as dist

    given = dict(kwargs)
    for name in RANK_FIXTURES:
        if name in given:
            given[name] = dist.get_rank() if name == "rank" else dist.get_world_size()
    import pytest

    try:
        result = func(**given)
    except pytest.skip.Exception as e:
        # pytest.skip() in a rank: a skip for the runners too (they know SkipTest).
        raise unittest.SkipTest(str(e.msg)) from None
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()  # no "never awaited" warning on top of the error
        raise TypeError(RETURNED_AWAITABLE.format(name=getattr(func, "__name__", func), what=type(result).__name__))


def rank_fixture_users(fixturedefs: Mapping[str, Sequence[Any]]) -> list[str]:
    """The fixtures (of a test's closure, pytest's ``name2fixturedefs``)
    that ask for a rank fixture, sorted."""
    return sorted(name for name, defs in fixturedefs.items() if name not in RANK_FIXTURES and defs
                  and set(getattr(defs[-1], "argnames", ())) & set(RANK_FIXTURES))


def is_async(func: Callable[..., Any]) -> bool:
    """True for an ``async def`` function (a coroutine or async generator's)."""
    return inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)


def run_function(func: Callable[..., Any], kwargs: dict[str, Any], size: int, mode: str,
                 name: str) -> None:
    """Run the plain test function ``func`` in ``size`` ranks (``mode``), in
    each with the default group made and the rank fixtures filled in.

    Raises what the ranks' outcome is: ``RankFailure``/``RankError``, or
    pytest's skip at the test's own line.
    """
    try:
        _run_function(func, kwargs, size, mode, name)
    except unittest.SkipTest as e:
        import pytest

        # pytest turned a SkipTest into its skip inside its own unittest
        # support, whose line "-rs" then showed for the test's; its skip
        # with the item's location (a private flag of pytest's, 7.0 on).
        try:
            skip = pytest.skip.Exception(str(e), _use_item_location=True)
        except TypeError:
            raise e from None
        raise skip from None


def _run_function(func: Callable[..., Any], kwargs: dict[str, Any], size: int, mode: str, name: str) -> None:
    size = parse_world_size(size, f"@pytest.mark.world_size on {name}")
    if mode == "threads":
        from disttest.runners.multithread import threads_test

        def body() -> None:
            _call(func, kwargs)

        body.__name__ = name
        # The function's faults apply, and a report with no frame of a rank points at it.
        body.__wrapped__ = func  # type: ignore[attr-defined]
        # As in processes: a rank's error other than an assertion is an error.
        threads_test(body, size, None, always_failure=False)()
        return
    case = _process_case(func, kwargs, size, name)
    result = _Reraise()
    case.run(result)
    if result.error is not None:
        raise result.error
    if result.skip_reason is not None:
        raise unittest.SkipTest(result.skip_reason)


def _process_case(func: Callable[..., Any], kwargs: dict[str, Any], size: int, name: str) -> unittest.TestCase:
    import torch.distributed as dist

    from disttest._runner import rank as rank_mod
    from disttest._runner import settings
    from disttest.runners.multiprocess import MultiProcessTestCase

    class FunctionInProcesses(MultiProcessTestCase):
        # NB: forked, so the function, its fixtures' values and its module
        # need not be importable or picklable in the rank.
        start_method = "fork"

        @property
        def world_size(self) -> int:
            return size

        def setUp(self) -> None:
            super().setUp()
            method, where = settings.start_method(type(self))  # a bad DISTTEST_START_METHOD is named
            if method == "spawn":  # (at the user's function: unittest's frames call setUp)
                code = getattr(inspect.unwrap(func), "__code__", None)
                warnings.warn_explicit(FORKED_NOT_SPAWNED.format(name=name, where=where), UserWarning,
                                       getattr(code, "co_filename", "<unknown>"),
                                       getattr(code, "co_firstlineno", 0))
            self._spawn_processes("fork")

    def test_function(self: MultiProcessTestCase) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        try:
            _call(func, kwargs)
        except BaseException:
            dist.destroy_process_group()
            raise
        # NB: as a MultiProcessTestCase rank does: destroyed once the parent
        # releases the rank (every rank answered). Destroyed now, its sockets
        # closed under a peer still in gloo's connect ("Connection closed by
        # peer"), and a test without a collective failed under load.
        if not rank_mod.after_release(dist.destroy_process_group):
            dist.destroy_process_group()

    # Named as the user's test (reports, faults' chaos seeds); a report with
    # no frame of a rank points at the user's function, whose faults apply.
    test_function.__name__ = test_function.__qualname__ = name
    test_function.__wrapped__ = func  # type: ignore[attr-defined]
    setattr(FunctionInProcesses, name, test_function)
    FunctionInProcesses.__qualname__ = FunctionInProcesses.__name__ = f"function {name}"
    return FunctionInProcesses(name)


def wants_ranks(func: Callable[..., Any]) -> bool:
    """True when ``func`` is a plain function (no ``self``)."""
    params = list(inspect.signature(func).parameters)
    return not params or params[0] != "self"


def xdist_device_slice(worker: int, workers: int, devices: Sequence[str]) -> list[str]:
    """The devices worker ``worker`` of ``workers`` may use: contiguous,
    disjoint slices, the first workers taking one more when they do not
    divide evenly; a worker beyond the number of devices gets none."""
    per, extra = divmod(len(devices), workers)
    start = worker * per + min(worker, extra)
    return list(devices[start:start + per + (1 if worker < extra else 0)])


def xdist_visible_devices(environ: Mapping[str, str], device_count: Callable[[], int]) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for this pytest-xdist worker, or None when not
    under xdist or without GPUs. Reads ``PYTEST_XDIST_WORKER`` (``gw3``) and
    ``PYTEST_XDIST_WORKER_COUNT``; the devices are ``CUDA_VISIBLE_DEVICES``
    if set, else ``device_count()`` of them. A replacement worker (``gw5``
    of 4) gets the slice of its number modulo the count."""
    worker_id = environ.get("PYTEST_XDIST_WORKER")
    raw_count = environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker_id or not raw_count:
        return None
    if not (worker_id.startswith("gw") and worker_id[2:].isdigit()):
        raise ConfigError("xdist worker", worker_id, "environment variable PYTEST_XDIST_WORKER", "expected gw<N>")
    workers = parse_world_size(raw_count, "environment variable PYTEST_XDIST_WORKER_COUNT", text=True)
    # A worker xdist started in place of a crashed one is numbered past the
    # count (gw2 of 2): it takes the slice of its number modulo the count (it
    # was refused, so every replacement died and the rest of the run was lost).
    worker = int(worker_id[2:]) % workers
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        devices = [str(i) for i in range(device_count())]
    if not devices:
        return None
    return ",".join(xdist_device_slice(worker, workers, devices))


def end_with_controller() -> Callable[[], None]:
    """In a pytest-xdist worker: when the controller (the parent) dies, end
    this process as SIGTERM does, at once (Linux: the parent-death signal),
    so that its ranks, their folders and what they started go with it
    (disttest's janitor acts on SIGTERM). Returns the undo.

    NB: execnet notices a dead controller too, but ends the worker only 15 s
    later: it first sends the worker a SIGINT, which an xdist worker ignores.
    Not a thread that watches: a process with a thread cannot be copied into
    the fork server. The signal is the parent thread's death, and xdist makes
    its workers from the controller's main thread."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    from disttest._runner import proctree

    libc = proctree.libc()
    parent = os.getppid()
    libc.prctl(proctree.PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # (gone already)
        os.kill(os.getpid(), signal.SIGTERM)
    return lambda: libc.prctl(proctree.PR_SET_PDEATHSIG, 0)


def apply_xdist_gpu_slice(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set this xdist worker's ``CUDA_VISIBLE_DEVICES``; return it (None: unchanged).

    NB: must run before CUDA is initialised in the worker; the device count
    comes from NVML (``torch.cuda.device_count``), which does not initialise it.
    """
    env = os.environ if environ is None else environ

    def count() -> int:
        import torch

        return int(torch.cuda.device_count())

    value = xdist_visible_devices(env, count)
    if value is not None:
        env["CUDA_VISIBLE_DEVICES"] = value
    return value
