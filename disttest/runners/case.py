"""``disttest.TestCase``: the base every runner builds on.

An ``expecttest.TestCase`` (so ``assertExpectedInline`` works) with every
method upstream's ``common_utils.TestCase`` adds to unittest's, whose
``assertEqual`` decides as upstream's does (tensors, arrays, numbers and
containers of them: :mod:`disttest.runners.case_equal`); ``setUp`` seeds
torch, numpy and ``random`` so that every rank starts from the same state.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import expecttest
import numpy as np
import torch

from disttest import _compat
from disttest._runner import settings
from disttest._runner.outcome import ask_locals
from disttest.runners.case_equal import assert_equal
from disttest.runners.case_parity import CaseParityMixin
from disttest.support.devices import has_accelerator
from disttest.support.skips import DistSkip, skip_for_exit_code

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+

__unittest = True

__all__ = ["DEFAULT_SEED", "TestCase", "assert_equal", "set_rng_seed"]

#: The seed ``TestCase.setUp`` uses unless a class sets ``seed``.
DEFAULT_SEED = settings.DEFAULT_SEED
#: Bases whose ``setUp`` and ``tearDown`` do not call ``super()``'s, by
#: (module, qualified name): upstream's ``common_utils.TestCase``. Upstream's
#: own runners derive from it, so it comes last in their classes' order; a
#: class that puts it before disttest's (``instantiate_device_type_tests``
#: makes ``(CPUTestBase, <the generic class's bases>)``) would cut disttest's
#: ``setUp`` off (no ranks start) unless the chain resumes after it.
CHAIN_BREAKERS = frozenset({("torch.testing._internal.common_utils", "TestCase")})


def _chain_breaker(cls: type) -> type | None:
    """The first of :data:`CHAIN_BREAKERS` in ``cls``'s method order that
    comes before :class:`TestCase`, or None."""
    for klass in cls.__mro__:
        if klass is TestCase:
            return None
        if (klass.__module__, klass.__qualname__) in CHAIN_BREAKERS:
            return klass
    return None


def set_rng_seed(seed: int = DEFAULT_SEED) -> None:
    """Seed torch, numpy and ``random`` in the calling process or thread."""
    if has_accelerator():
        torch.manual_seed(seed)
    else:
        # torch.manual_seed also queues lazy seeding for every accelerator
        # module, recording a stack trace for each (~0.5 ms): not needed here.
        torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class _EqualOptions(TypedDict, total=False):
    """The keyword options of :func:`assert_equal`, which
    :meth:`TestCase.assertEqual` passes on."""

    rtol: float | None
    atol: float | None
    equal_nan: bool
    exact_dtype: bool
    exact_device: bool
    exact_layout: bool
    exact_stride: bool
    exact_is_coalesced: bool


def _exit_skips(call: Callable[..., None], *args: Any) -> None:
    """``call(*args)``, with ``sys.exit(TEST_SKIPS[key].exit_code)`` a skip,
    not an error: upstream suites skip so, in ``setUp`` as in the test, and
    a plain test (or one under ``run_rank``) behaves as a rank."""
    try:
        call(*args)
    except SystemExit as e:
        skip = skip_for_exit_code(e.code)
        if skip is None:
            raise
        raise DistSkip(skip) from None


class TestCase(CaseParityMixin, expecttest.TestCase):
    """A unittest TestCase with tensor-aware equality and seeded RNGs.

    It has every method upstream's ``common_utils.TestCase`` adds to
    unittest's (:class:`~disttest.runners.case_parity.CaseParityMixin`).

    ``setUp`` seeds torch, numpy and ``random`` with ``seed`` (a class
    attribute, default :data:`DEFAULT_SEED`); the runners call it in every
    rank, so all ranks start from the same random state.
    """

    seed: int = DEFAULT_SEED

    # Upstream's test process has c10d's ``fake`` backend: its ``fake_pg``
    # module registers it when imported, and suites import ``FakeStore``
    # from there to call ``init_process_group("fake", ...)``. disttest
    # registers it at no import: here, for the class (from ``setUpClass``
    # to its class cleanups) and for each test (``run``, for a test run on
    # its own or a ``setUpClass`` that skipped ``super()``), each with its undo.

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        undo = _compat.install_fake_backend()
        if undo is not None:
            cls.addClassCleanup(undo)

    def run(self, result: Any = None) -> Any:
        undo = _compat.install_fake_backend()
        # (unittest's --locals: a rank formats its own tracebacks, so it is told)
        undo_locals = ask_locals(True) if getattr(result, "tb_locals", False) is True else None
        try:
            return super().run(result)
        finally:
            if undo_locals is not None:
                undo_locals()
            if undo is not None:
                undo()

    def setUp(self) -> None:
        self._chain_reached = True
        seed = settings.seed(self)  # a bad one refused before anything changes (tearDown would not undo it)
        super().setUp()
        set_rng_seed(seed)

    def tearDown(self) -> None:
        self._chain_reached = True
        super().tearDown()

    def _callSetUp(self) -> None:
        _exit_skips(self._resume_chain, "setUp", super()._callSetUp)  # type: ignore[misc]

    def _callTearDown(self) -> None:
        self._resume_chain("tearDown", super()._callTearDown)  # type: ignore[misc]

    def _resume_chain(self, name: str, call: Any) -> None:
        """``call()`` (unittest's call of ``setUp`` or ``tearDown``); if a
        base of :data:`CHAIN_BREAKERS` ended the chain before disttest's part
        of it, go on from where that base stopped, as if it had called
        ``super()``'s."""
        self._chain_reached = False
        call()
        if not self._chain_reached:
            breaker = _chain_breaker(type(self))
            if breaker is not None:
                getattr(super(breaker, self), name)()

    def _callTestMethod(self, method: Any) -> None:
        _exit_skips(super()._callTestMethod, method)  # type: ignore[misc]

    def assertEqual(  # upstream's names: x, y
        self, x: Any, y: Any, msg: str | Callable[[str], str] | None = None,
        **options: Unpack[_EqualOptions],
    ) -> None:
        """Fail unless ``x`` equals ``y`` as upstream's
        ``TestCase.assertEqual`` decides it (see :func:`assert_equal`, whose
        keyword options it takes). A string ``msg`` follows torch's message,
        or replaces it where ``longMessage`` is false."""
        if isinstance(msg, str) and not self.longMessage:
            text = msg

            def msg(_generated: str) -> str:
                return text

        # upstream's @precisionOverride/@toleranceOverride set these (CaseParityMixin).
        rel_tol, precision = getattr(self, "rel_tol", 0.0), getattr(self, "precision", 0.0)
        assert_equal(x, y, msg, **options, rtol_override=rel_tol, atol_override=precision)

    def assertGreaterAlmostEqual(
        self, first: float, second: float, places: int | None = None,
        msg: str | None = None, delta: float | None = None,
    ) -> None:
        """Fail unless ``first >= second``, or short of it by at most
        ``delta`` (or by nothing when rounded to ``places``, default 7)."""
        if delta is not None and places is not None:
            raise TypeError("specify delta or places not both")
        if first >= second:
            return
        short = second - first
        if delta is not None:
            if short <= delta:
                return
            detail = f"{first} not greater than or equal to {second} within {delta} delta"
        else:
            places = 7 if places is None else places
            if round(short, places) == 0:
                return
            detail = f"{first} not greater than or equal to {second} within {places} places"
        raise self.failureException(self._formatMessage(msg, detail))

    def assertNotEqual(  # upstream's names: x, y
        self, x: Any, y: Any, msg: str | None = None, **options: Unpack[_EqualOptions]
    ) -> None:
        """Fail if ``x`` equals ``y`` under :meth:`assertEqual`'s rules, as
        upstream's does: an error of the comparison (a tensor against a
        str) is the test's error, and the failure reads "AssertionError not
        raised"."""
        with self.assertRaises(AssertionError, msg=msg):
            self.assertEqual(x, y, msg, **options)

