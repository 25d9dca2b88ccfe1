"""Simulated worlds: thousands of ranks in the test's own thread.

:class:`SimulatedTestCase` runs each test once, in the test process, under
torch's ``LocalTensorMode`` over the ``fake`` process group: a tensor the test
makes is a LocalTensor that holds one value per simulated rank, every op runs
once per rank, and collectives combine the ranks' values. So a DTensor or
DeviceMesh test runs at a world size no machine has (4096 ranks on a
16x16x16 mesh), skipped, saying why, where the installed torch lacks the mode.

For the test's duration (installed in ``setUp``, undone in a cleanup, never
at import) disttest replaces parts of the mode whose cost grows with the
square of the world or costs per rank more than the op does
(:data:`~disttest._compat.LOCAL_TENSOR_SPEEDUPS`); every rank gets the same
values and RNG streams as under upstream's. ``speedups = ()`` on a class runs
upstream's code unchanged.

:class:`SpmdMixin` holds what a test body needs in every mode (a mesh, a
per-rank assertion, the ranks' values, the value they share); :func:`run_simulated` makes the
simulated class of a body that :func:`~disttest.run_in` also runs as threads
and processes.

Layer: a subsystem base (imports the runners, the process groups and
``_compat``).
"""

from __future__ import annotations

import contextlib
import math
import operator
import sys
import threading
import time
import unittest
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from disttest import _compat
from disttest._runner import settings
from disttest._runner.deadline import held
from disttest._runner.report import warn_at
from disttest.bases._rank_int import (  # (re-exported: their documented home is this module)
    RANK_NOT_INT,
    RANK_SPLIT,
    SHOWN_RANKS,
    RankSplit,
    _answers_split,
    _per_rank_int,
    _rank_node,
)
from disttest.config import TIMEOUT_FALLBACK, ConfigError, marked_world_size, parse_world_size
from disttest.faults import CHAOS_ENV, FAULT_ENV, chaos_seed, env_faults
from disttest.pg._local import rank_runs
from disttest.runners.case import TestCase, assert_equal
from disttest.runners.modes import SIMULATED_MODE, body_world_size, only_in_forced_mode
from disttest.runners.multithread import restore_hooks

RankSplit.__module__ = __name__  # (shown, and pickled, by the name users import it by)

__unittest = True

__all__ = [
    "MISSING_RANKS",
    "OUTSIDE_RANKS",
    "RANKS_DIFFER",
    "RANKS_EQUAL",
    "RANK_NOT_INT",
    "RANK_SPLIT",
    "RankSplit",
    "SIMULATED_MODE",
    "SimulatedTestCase",
    "SpmdMixin",
    "VALUE_MISSES_RANKS",
    "run_simulated",
]

#: A per-rank comparison failed: how many of the ranks checked differ (every
#: rank in a simulated test, this rank as threads or processes), and the
#: first few, each as ``rank 17: got [...] expected [...]`` and why.
RANKS_DIFFER = "{count} of the {total} ranks checked differ (disttest){msg}:\n{details}"
RANK_DIFFERS = "rank {rank}: got {got} expected {expected}"
#: Why a mesh shape is refused.
MESH_NOT_THE_WORLD = "expected positive ints whose product is the world size, {world}"
#: ``assertNotEqual`` of per-rank values equal on some ranks.
RANKS_EQUAL = ("{count} of the {total} ranks checked are equal (disttest){msg}: {which}, where each rank's "
               "values must differ")
#: A ``{rank: value}`` expectation that lacks some of the ranks checked.
MISSING_RANKS = "the expected values name no value for rank(s) {ranks} ({n} of the {world} ranks checked) (disttest)"
#: A ``{rank: value}`` expectation with keys that are not ranks of the world.
OUTSIDE_RANKS = "the expected values name {keys}, not rank(s) of the world of {world} (disttest)"
#: A simulated value that holds only some of the world's ranks (they went unchecked).
VALUE_MISSES_RANKS = "the value checked holds no value for rank(s) {ranks} ({n} of the {world} ranks) (disttest)"
#: A simulated test that left dispatch modes entered (they are exited for it).
MODES_LEFT = ("the test left {n} torch dispatch mode(s) entered ({names}) (disttest): they are exited now; "
              "enter a mode with a `with` block")
#: A simulated test that ran past its timeout: raised into the test's thread.
SIMULATED_TIMED_OUT = ("{test!r} did not finish within {timeout}s (disttest): its simulated world of {n} ranks "
                       "runs in the test's own thread, stopped where it was:\n{stack}")
#: ``DISTTEST_FAULT`` or ``DISTTEST_CHAOS`` set for a run that has simulated tests.
RUN_FAULTS_IDLE = ("{variable} does not act on {test!r} (disttest): a simulated world has no rank threads or "
                   "processes to inject into or reorder; it runs as it is")
#: How many values of a tensor a failure shows.
SHOWN_VALUES = 16


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.is_quantized:  # (its values as numbers: tolist() of it fails, "load_scalar: invalid type")
            value = value.dequantize()
        if value.layout != torch.strided:  # (sparse: its values where they are)
            value = value.to_dense()
        flat = value.detach().reshape(-1)
        if flat.numel() <= SHOWN_VALUES:
            return str(value.tolist())
        head = flat[:SHOWN_VALUES].tolist()
        return f"{str(head)[:-1]}, ...] (shape {tuple(value.shape)})"
    return repr(value)


def _local(value: Any) -> Any:
    """A DTensor's local tensor (each rank's shard), in every mode; anything else as it is."""
    return value.to_local() if hasattr(value, "placements") and hasattr(value, "to_local") else value


def _leaf_per_rank(value: Any) -> dict[int, Any] | None:
    value = _local(value)  # (a DTensor in a list: its local values)
    shards = _compat.local_tensor_shards(value)
    return shards if shards is not None else _compat.local_int_values(value)


def _per_rank(value: Any) -> dict[int, Any] | None:
    """A simulated value's per-rank values, also of lists, tuples and dicts
    that hold simulated values (each rank's holds that rank's value in place
    of each); None for a value that holds none."""
    direct = _leaf_per_rank(value)
    if direct is not None:
        return direct
    pytree = _compat.pytree()
    leaves, spec = pytree.tree_flatten(value)
    split = [_leaf_per_rank(leaf) for leaf in leaves]
    ranks = next((sorted(values) for values in split if values is not None), None)
    if ranks is None:
        return None
    return {rank: pytree.tree_unflatten([leaf if values is None else values[rank]
                                         for leaf, values in zip(leaves, split, strict=True)], spec)
            for rank in ranks}


def _plain() -> contextlib.AbstractContextManager[Any]:
    """The local-tensor mode disabled (plain tensors, plain ops) while inside."""
    lt = _compat.local_tensor()
    return lt.maybe_disable_local_tensor_mode() if lt is not None else contextlib.nullcontext()


class SpmdMixin:
    """What a test body uses in every mode: simulated, threads, processes.

    In a simulated test every rank is this thread and a value holds every
    rank's; as threads or processes a value is this rank's. The helpers hide
    the difference, so one body runs as all three (see :func:`run_simulated`).
    """

    world_size: Any
    rank: Any
    #: The device type of :meth:`mesh` ("cpu").
    device_type: str = "cpu"

    def mesh(self, *shape: int, names: tuple[str, ...] | None = None) -> Any:
        """A DeviceMesh of ``shape`` (default: one dimension of ``world_size``)
        over the default group (``init_device_mesh``; with the simulated mode
        disabled while it is built, as upstream's local bases do)."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = shape or (int(self.world_size),)
        # (a shape of other ranks than the world's was taken, and its mesh
        # failed later with a bare AssertionError; "8" or -1 with torch's words)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape) or \
                math.prod(shape) != int(self.world_size):
            raise ConfigError("mesh shape", shape, f"{type(self).__name__}.mesh(...)",
                              MESH_NOT_THE_WORLD.format(world=int(self.world_size)))
        with _plain():
            return init_device_mesh(self.device_type, shape, mesh_dim_names=names)

    def rank_values(self, value: Any) -> dict[int, Any]:
        """``{rank: value on that rank}``: every rank's in a simulated test
        (its LocalTensor's tensors, a per-rank int's ints), else this rank's;
        a DTensor's local tensor (its shard) in every mode."""
        value = _local(value)
        per_rank = _per_rank(value)
        if per_rank is not None:
            return per_rank
        lt = _compat.local_tensor()
        mode = lt.local_tensor_mode() if lt is not None else None  # enabled or not
        if mode is not None:
            return dict.fromkeys(sorted(mode.ranks), value)
        return {int(self.rank): value}

    def replicated(self, value: Any) -> Any:
        """The value every rank holds, as a plain value: in a simulated test a
        LocalTensor or per-rank int whose ranks all agree (an AssertionError
        naming those that differ otherwise); as threads or processes,
        ``value``; a DTensor's local tensor in every mode. Index this, not the
        LocalTensor, in an expected-value function: an op on a LocalTensor
        runs once per rank."""
        value = _local(value)
        per_rank = _per_rank(value)
        if per_rank is None:
            return value
        first = next(iter(per_rank.values()))
        with _plain():
            _assert_ranks_equal(per_rank, dict.fromkeys(per_rank, first), "not the same on every rank", {})
            return first.clone() if isinstance(first, torch.Tensor) else first

    def assertRanksEqual(self, actual: Any, expected: Any, msg: str | Callable[[str], str] | None = None,
                         **options: Any) -> None:
        """Fail unless every rank's ``actual`` equals its ``expected``: a
        function of the rank, a ``{rank: value}`` mapping, a simulated value,
        or one value for all. A failure names the ranks that differ (the first
        :data:`SHOWN_RANKS`, with both values) and how many do. A DTensor
        (either side) is checked by its local tensor, each rank's shard, in
        every mode. Takes :meth:`~disttest.TestCase.assertEqual`'s options
        (``rtol``, ``atol``...)."""
        got = self.rank_values(actual)
        expected = _local(expected)
        lt = _compat.local_tensor()
        mode = lt.local_tensor_mode() if lt is not None else None
        simulated = set(mode.ranks) if mode is not None else set(got)
        missing = sorted(simulated - set(got))
        if missing:  # (a LocalTensor of some ranks: the others went unchecked)
            raise AssertionError(VALUE_MISSES_RANKS.format(
                ranks=", ".join(map(str, missing[:SHOWN_RANKS])) + (" ..." if len(missing) > SHOWN_RANKS else ""),
                n=len(missing), world=len(simulated)))
        with _plain():
            if callable(expected) and not isinstance(expected, torch.Tensor):
                want = {}
                for r in got:
                    try:
                        want[r] = expected(r)
                    except Exception as e:
                        if hasattr(e, "add_note"):  # (Python 3.11+)
                            e.add_note(f"(disttest: raised by the expected value's function, asked for rank {r})")
                        raise
                    # (a simulated value it returns, made outside: that rank's value of it)
                    of_each = _per_rank(_local(want[r]))
                    if of_each is not None:
                        want[r] = of_each[r]
            elif isinstance(expected, Mapping):
                world = int(self.world_size)
                outside = [k for k in expected if not _a_rank(k, world)]
                if outside:  # (they were ignored: a typo in the expectation passed unseen)
                    raise AssertionError(OUTSIDE_RANKS.format(
                        keys=", ".join(map(repr, outside[:SHOWN_RANKS])) + (" ..." if len(outside) > SHOWN_RANKS
                                                                            else ""), world=world))
                missing = sorted(set(got) - set(expected))
                if missing:
                    raise AssertionError(MISSING_RANKS.format(
                        ranks=", ".join(map(str, missing[:SHOWN_RANKS])) + (" ..." if len(missing) > SHOWN_RANKS
                                                                            else ""), n=len(missing), world=len(got)))
                want = {r: expected[r] for r in got}
            else:
                per_rank = _per_rank(expected)
                want = {r: (per_rank[r] if per_rank is not None else expected) for r in got}
            _assert_ranks_equal(got, want, msg, options)


def _a_rank(key: Any, world: int) -> bool:
    """Whether a mapping's ``key`` is a rank of a world of ``world`` (an int,
    numpy's too; not a bool)."""
    if isinstance(key, bool):
        return False
    try:
        return 0 <= operator.index(key) < world
    except TypeError:
        return False


def _same(a: Any, b: Any) -> bool:
    # (the fast path, for dense tensors: torch.equal takes no sparse or quantized one)
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.device == b.device and a.layout == b.layout == torch.strided
            and not a.is_quantized and not b.is_quantized and bool(torch.equal(a, b)))


def _assert_ranks_equal(got: dict[int, Any], want: dict[int, Any], msg: str | Callable[[str], str] | None,
                        options: dict[str, Any]) -> None:
    differ: list[tuple[int, str]] = []
    for rank in sorted(got):
        if _same(got[rank], want[rank]):
            continue
        try:
            assert_equal(got[rank], want[rank], **options)
        except AssertionError as e:
            differ.append((rank, str(e)))
    if not differ:
        return
    details = []
    for rank, why in differ[:SHOWN_RANKS]:
        details.append(RANK_DIFFERS.format(rank=rank, got=_show(got[rank]), expected=_show(want[rank])))
        lines = [line.strip() for line in why.strip().splitlines()]
        details.append("  " + "; ".join(line for line in lines if line and line != "Tensor-likes are not close!"))
    if len(differ) > SHOWN_RANKS:
        details.append(f"... and {len(differ) - SHOWN_RANKS} more")
    text = RANKS_DIFFER.format(count=len(differ), total=len(got), msg=f": {msg}" if isinstance(msg, str) else "",
                               details="\n".join(details))
    raise AssertionError(msg(text) if callable(msg) else text)


def _drop_own_frames(exc: BaseException) -> None:
    """End the traceback of an error disttest raised for the test
    (:class:`RankSplit`, a per-rank value refused) at the last frame that is
    not disttest's: unittest drops those frames from a failure's traceback
    only, and this is an error, not a failure. An error of any other
    class keeps its whole traceback."""
    if not type(exc).__module__.startswith("disttest."):
        return
    last = None
    tb = exc.__traceback__
    while tb is not None:
        if "__unittest" not in tb.tb_frame.f_globals:
            last = tb
        tb = tb.tb_next
    if last is not None:
        last.tb_next = None


class SimulatedTestCase(SpmdMixin, TestCase):
    """Each test runs once, in the test process, with ``world_size`` ranks
    simulated by torch's ``LocalTensorMode``.

    ``setUp`` makes the default group (c10d's ``fake`` backend, ``world_size``
    ranks, this process rank 0 of it), installs disttest's speedups
    (``speedups``), then enters the mode for every rank; cleanups undo each
    in reverse. The test body, and a subclass's ``setUp`` after
    ``super().setUp()``, run inside the mode: a tensor it makes holds one
    value per rank, ``self.rank`` is a per-rank int, and :meth:`assertEqual`
    compares rank by rank, naming the ranks that differ. No threads or
    processes start: ``setUp``, the test, ``tearDown`` and the test's own
    cleanups together are held to the test's timeout (the class's ``timeout``, else ``DISTTEST_TIMEOUT``) by
    an exception raised into this thread, whose report shows where it was
    (:class:`~disttest._runner.deadline.Deadline`). ``DISTTEST_FAULT`` and
    ``DISTTEST_CHAOS`` have no ranks here to act on: a warning says so.

    Skips, saying why, where the installed torch lacks ``LocalTensorMode`` or
    the ``fake`` backend.

    Class attributes: ``world_size`` (any int >= 1, default 4),
    ``device_type`` ("cpu"), ``speedups`` (names from
    :data:`~disttest._compat.LOCAL_TENSOR_SPEEDUPS`, default all; ``()`` runs
    upstream's code unchanged).
    """

    world_size: int = 4
    speedups: tuple[str, ...] = _compat.LOCAL_TENSOR_SPEEDUPS

    #: The test's LocalTensorMode (entered in ``setUp``).
    mode: Any = None
    #: How many cleanups disttest's ``setUp`` registered (those after it are the test's own).
    _own_cleanups: int | None = None

    def run(self, result: Any = None) -> Any:
        # NB: unittest runs no cleanup when a test is interrupted (Ctrl-C);
        # the mode, the group and torch's patched code must not outlive it.
        try:
            return super().run(result)
        except KeyboardInterrupt:
            self.doCleanups()
            raise

    def _callSetUp(self) -> None:
        self._timeout = settings.test_timeout(self, self.id()) or TIMEOUT_FALLBACK
        self._ends_at = time.monotonic() + self._timeout
        self._held(super()._callSetUp)

    def _callTestMethod(self, method: Any) -> None:
        self._held(super()._callTestMethod, method)

    def _callTearDown(self) -> None:
        self._held(super()._callTearDown)

    def _callCleanup(self, function: Any, /, *args: Any, **kwargs: Any) -> None:
        # The test's own cleanups (those it added after setUp's) are held
        # too; disttest's, which undo the mode and torch's patches, run whole.
        if self._own_cleanups is not None and len(self._cleanups) >= self._own_cleanups:  # type: ignore[attr-defined]  # (unittest's list)
            self._held(super()._callCleanup, function, *args, **kwargs)  # type: ignore[misc]  # (typeshed lacks it)
        else:
            super()._callCleanup(function, *args, **kwargs)  # type: ignore[misc]

    def _held(self, call: Callable[..., None], *args: Any) -> None:
        """``call(*args)`` held to what is left of the test's timeout (setUp,
        the test, tearDown and the test's own cleanups together, as a rank's
        are; disttest's cleanups are not cut short)."""
        head = SIMULATED_TIMED_OUT.format(test=self._testMethodName, timeout=self._timeout, n=self.world_size,
                                          stack="").rstrip(":\n")
        try:
            stack = held(call, args, self._ends_at, head)
        except Exception as e:
            _drop_own_frames(e)
            raise
        if stack is not None:
            raise TimeoutError(SIMULATED_TIMED_OUT.format(
                test=self._testMethodName, timeout=self._timeout, n=self.world_size, stack=stack)) from None

    def setUp(self) -> None:
        super().setUp()
        for variable, value in ((FAULT_ENV, env_faults()), (CHAOS_ENV, chaos_seed())):
            if value:  # (a bad value is refused as everywhere)
                warn_at(getattr(self, self._testMethodName, None),
                        RUN_FAULTS_IDLE.format(variable=variable, test=self._testMethodName))
        lt = _compat.local_tensor()
        if lt is None:
            raise unittest.SkipTest(_compat.LOCAL_TENSOR_MISSING.format(version=torch.__version__))
        reason = _compat.missing_feature("Backend.FAKE")
        if reason is not None:
            raise unittest.SkipTest(f"c10d's fake backend {reason} (disttest)")
        cls, name = type(self), self._testMethodName
        if (marked_world_size(cls, name) is not None
                or getattr(getattr(self, name, None), "_required_world_size", None) is not None):
            # (a pytest world_size marker, requires_world_size: as every runner reads them)
            size = settings.world_size(self, name)
            self.world_size = size
        else:
            size = parse_world_size(self.world_size, f"{cls.__name__}.world_size")
            self.world_size = size  # (np.int64(4) as an int: a mesh of it failed deep in torch)
        if not isinstance(self.speedups, (tuple, list, frozenset, set)) or not all(
                isinstance(n, str) and n in _compat.LOCAL_TENSOR_SPEEDUPS for n in self.speedups):
            # (a string would be read letter by letter; an unknown name was a
            # ValueError that did not say where it came from)
            raise ConfigError("local-tensor speedups", self.speedups, f"{type(self).__name__}.speedups",
                              f"expected a tuple of names from {_compat.LOCAL_TENSOR_SPEEDUPS}, or ()")
        # (c10d's fake backend: registered by disttest.TestCase.run around the test)
        from disttest.pg.fake import FakeStore

        # (each init_process_group wraps sys.excepthook: "[rank0]: [rank0]: ..." after two tests)
        self.addCleanup(restore_hooks, sys.excepthook, threading.excepthook)
        # (each cleanup before what it undoes: a timeout or Ctrl-C between the
        # two left the group, or the mode, to the next test; both undo nothing
        # where nothing was done)
        self.addCleanup(_destroy_default_group)
        dist.init_process_group("fake", rank=0, world_size=size, store=FakeStore())
        self.addCleanup(_compat.reset_dtensor_rng_tracker)
        self.addCleanup(_compat.install_local_tensor_speedups(self.speedups))
        self.addCleanup(_compat.install_rank_answers(_answers_split, _per_rank_int))
        self.mode = lt.LocalTensorMode(frozenset(range(size)))
        self.addCleanup(_leave, self.mode)
        self.mode.__enter__()
        # (as the thread runner puts it back: the same body leaves the same state in every mode)
        self.addCleanup(torch.set_default_dtype, torch.get_default_dtype())
        self._own_cleanups = len(self._cleanups)  # type: ignore[attr-defined]  # (unittest's list)

    @property
    def rank(self) -> Any:
        """Every rank's number, as a per-rank int (``SymInt``). Arithmetic
        on it gives per-rank ints; a comparison whose answer differs between
        the ranks (``self.rank == 0``), ``int()`` or indexing a list with it
        raises :class:`RankSplit`: every rank runs the line at once."""
        if self.world_size == 1:  # (one value: torch's constant node, which int() and seeding refuse)
            return 0
        return torch.SymInt(_rank_node()({r: r for r in range(self.world_size)}))  # type: ignore[no-untyped-call]  # torch: unannotated

    def assertEqual(self, x: Any, y: Any, msg: str | Callable[[str], str] | None = None,  # type: ignore[override]
                    **options: Any) -> None:
        """Fail unless ``x`` equals ``y``; where either holds per-rank
        values (a LocalTensor, a per-rank int), rank by rank, naming the ranks
        that differ (see :meth:`assertRanksEqual`); lists, tuples and dicts
        holding such values too, each rank's with that rank's values."""
        # (two DTensors: their local tensors; torch's error from inside the
        # comparison named no rank)
        x, y, pairs = _rank_pairs(x, y)
        with _plain():
            if pairs is None:
                super().assertEqual(x, y, msg, **options)
                return
            _assert_ranks_equal(*pairs, msg, options)

    def assertNotEqual(self, x: Any, y: Any, msg: str | Callable[[str], str] | None = None,  # type: ignore[override]
                       **options: Any) -> None:
        """Fail if ``x`` equals ``y``; where either holds per-rank values,
        on any rank (each rank's values must differ), naming the ranks where
        they are equal. (As the inverse of :meth:`assertEqual` it passed
        where any one rank differed.)"""
        x, y, pairs = _rank_pairs(x, y)
        if pairs is None:
            super().assertNotEqual(x, y, msg, **options)  # type: ignore[arg-type]  # (a callable msg as assertEqual takes)
            return
        got, want = pairs
        ranks = sorted(got)
        equal = []
        with _plain():
            for r in ranks:
                try:
                    super().assertEqual(got[r], want[r], **options)
                except AssertionError:
                    continue
                equal.append(r)
        if equal:
            text = msg(str(equal)) if callable(msg) else msg
            raise self.failureException(RANKS_EQUAL.format(count=len(equal), total=len(ranks),
                                                           msg=f": {text}" if text else "",
                                                           which=f"rank{'s' * (len(equal) > 1)} {rank_runs(equal)}"))


def _rank_pairs(x: Any, y: Any) -> tuple[Any, Any, tuple[dict[int, Any], dict[int, Any]] | None]:
    """``x`` and ``y`` (two DTensors as their local tensors, as assert_close
    compares them; one against anything else a TypeError) and, where either
    holds per-rank values, each rank's value of each (one that holds none is
    every rank's); None where neither does."""
    x, y = _compat.unwrap_dtensors(x, y)
    got, want = _per_rank(x), _per_rank(y)
    if got is None and want is None:
        return x, y, None
    ranks = sorted(got if got is not None else want)  # type: ignore[arg-type]  # one is not None
    return x, y, (got if got is not None else dict.fromkeys(ranks, x),
                  want if want is not None else dict.fromkeys(ranks, y))


def _leave(mode: Any) -> None:
    """Exit the test's ``mode``; first exit, and fail for, the dispatch
    modes the test entered above it and left entered (they would stay for
    the rest of the process, and ``mode.__exit__`` would pop one of them)."""
    stack = _compat.dispatch_modes()
    at = next((i for i, m in enumerate(stack) if m is mode), None)
    if at is None:
        return  # the test exited it itself
    leaked = stack[at + 1:]
    for inner in reversed(leaked):
        inner.__exit__(None, None, None)
    mode.__exit__(None, None, None)
    if leaked:
        raise AssertionError(MODES_LEFT.format(n=len(leaked), names=", ".join(type(m).__name__ for m in leaked)))


def _destroy_default_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def run_simulated(body: type | None = None, *, world_size: int | None = None) -> Any:
    """Class decorator: a :class:`SimulatedTestCase` of the test methods of
    ``body`` (a plain class, as :func:`~disttest.run_in` takes), named
    ``<Class>_simulated``, in the body's module; ``world_size`` overrides the
    body's (so one body can run as 8 threads and as 4096 simulated ranks).
    Stacked for several sizes, each further one is ``<Class>_simulated_<size>``.
    Stacks with ``@run_in(...)``; with ``DISTTEST_MODE`` naming another mode
    the simulated class skips, saying why. Returns the body unchanged."""

    def decorator(cls: type) -> type:
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
            raise TypeError(f"run_simulated: {cls.__name__} must be a plain class of test methods, "
                            "not a TestCase (disttest makes the TestCase)")
        where = f"run_simulated({cls.__name__})" if world_size is not None else f"{cls.__name__}.world_size"
        size = parse_world_size(world_size if world_size is not None else body_world_size(cls, 4), where)
        name = f"{cls.__name__}_{SIMULATED_MODE}"
        earlier = getattr(sys.modules[cls.__module__], name, None)
        if isinstance(earlier, type) and cls in earlier.__bases__:  # stacked: one class a size
            if getattr(earlier, "world_size", None) == size:
                raise TypeError(f"run_simulated: {cls.__name__} is simulated at world size {size} twice")
            name = f"{name}_{size}"  # (the second took its place: the first size never ran)
        made: Any = type(name, (cls, SimulatedTestCase), {"world_size": size, "__module__": cls.__module__})
        made.__qualname__ = made.__name__
        setattr(sys.modules[cls.__module__], made.__name__, only_in_forced_mode(made, SIMULATED_MODE))
        return cls

    return decorator(body) if body is not None else decorator


# A pytest world_size marker on a test sets the simulated world's size, as for every runner.
setattr(SimulatedTestCase, settings.READS_MARKER, True)
