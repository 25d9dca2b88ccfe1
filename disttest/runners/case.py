"""``disttest.TestCase``: the base every runner builds on.

An ``expecttest.TestCase`` (so ``assertExpectedInline`` works) whose
``assertEqual`` understands tensors, numpy arrays, Python numbers and nested
lists, tuples and dicts of them, comparing numbers with
``torch.testing.assert_close``; ``setUp`` seeds torch, numpy and ``random`` so
that every rank starts from the same state.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import expecttest
import numpy as np
import torch

from disttest import _compat
from disttest._runner import settings
from disttest.runners.case_parity import CaseParityMixin
from disttest.support.devices import has_accelerator
from disttest.support.skips import DistSkip, skip_for_exit_code

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+

__unittest = True

__all__ = ["DEFAULT_SEED", "TestCase", "assert_equal", "set_rng_seed"]

#: The seed ``TestCase.setUp`` uses unless a class sets ``seed``.
DEFAULT_SEED = 1234
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


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float, complex, np.number, np.bool_))


def _is_tensor_like(x: object) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray)) or _is_number(x)


def _is_sequence(x: object) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes, bytearray))


def _coerce(actual: Any, expected: Any, exact_dtype: bool) -> tuple[Any, Any, bool]:
    """Make a mixed pair comparable by ``assert_close``.

    A tensor compared with a Python number or list takes the other side to a
    tensor of the same dtype and device (the dtype is then not checked); a
    tensor compared with a numpy array converts the array, keeping its dtype.
    Two Python numbers compare by value, whatever their types.
    """
    a_tensor = isinstance(actual, torch.Tensor)
    e_tensor = isinstance(expected, torch.Tensor)
    if a_tensor != e_tensor:
        tensor, other = (actual, expected) if a_tensor else (expected, actual)
        if isinstance(other, np.ndarray):
            converted = torch.as_tensor(other, device=tensor.device)
            check = exact_dtype
        else:
            converted = torch.as_tensor(other, dtype=tensor.dtype, device=tensor.device)
            check = False
        return (tensor, converted, check) if a_tensor else (converted, tensor, check)
    if _is_number(actual) and _is_number(expected):
        return actual, expected, False
    return actual, expected, exact_dtype


class _EqualOptions(TypedDict, total=False):
    """The keyword options of :func:`assert_equal`, which
    :meth:`TestCase.assertEqual` passes on."""

    rtol: float | None
    atol: float | None
    equal_nan: bool
    exact_dtype: bool
    exact_device: bool


def assert_equal(
    actual: Any,
    expected: Any,
    msg: str | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    exact_dtype: bool = True,
    exact_device: bool = False,
    rtol_override: float = 0.0,
    atol_override: float = 0.0,
) -> None:
    """Assert that ``actual`` equals ``expected``, recursing into containers.

    Numeric leaves (tensors, arrays, numbers) go through
    ``torch.testing.assert_close``; other leaves compare with ``==``. A
    mismatch raises ``AssertionError`` naming the path of the first differing
    leaf (``at [1]['w']``). With only one of ``rtol``/``atol`` given, the other
    is 0. ``rtol_override``/``atol_override`` raise each leaf's tolerances (the
    given ones, else the dtype's defaults) to at least themselves, as
    upstream's ``TestCase.rel_tol``/``precision`` do.
    """
    if (rtol is None) != (atol is None):
        rtol, atol = rtol or 0.0, atol or 0.0
    floors = (rtol_override, atol_override)
    _compare(actual, expected, "", msg, rtol, atol, equal_nan, exact_dtype, exact_device, floors)


def _fail(path: str, user_msg: str | None, detail: str) -> None:
    where = f"at {path}: " if path else ""
    text = f"{where}{detail}"
    raise AssertionError(f"{text}\n{user_msg}" if user_msg else text)


def _compare(
    actual: Any,
    expected: Any,
    path: str,
    user_msg: str | None,
    rtol: float | None,
    atol: float | None,
    equal_nan: bool,
    exact_dtype: bool,
    exact_device: bool,
    floors: tuple[float, float] = (0.0, 0.0),
) -> None:
    if _is_tensor_like(actual) and _is_tensor_like(expected) or (
        isinstance(actual, torch.Tensor) != isinstance(expected, torch.Tensor)
        and (_is_sequence(actual) or _is_sequence(expected))
    ):
        actual, expected, check_dtype = _coerce(actual, expected, exact_dtype)
        if floors[0] or floors[1]:
            if rtol is None or atol is None:
                rtol, atol = _compat.default_tolerances(actual, expected)
            rtol, atol = max(rtol, floors[0]), max(atol, floors[1])
        try:
            torch.testing.assert_close(
                actual,
                expected,
                rtol=rtol,
                atol=atol,
                equal_nan=equal_nan,
                check_dtype=check_dtype,
                check_device=exact_device,
            )
        except (AssertionError, TypeError, ValueError) as e:
            detail = str(e)
        else:
            return
        _fail(path, user_msg, detail)
        return
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            missing = sorted(map(repr, set(expected) - set(actual)))
            extra = sorted(map(repr, set(actual) - set(expected)))
            _fail(path, user_msg, f"keys differ: missing {missing}, unexpected {extra}")
        for key in expected:
            _compare(
                actual[key], expected[key], f"{path}[{key!r}]", user_msg,
                rtol, atol, equal_nan, exact_dtype, exact_device, floors,
            )
        return
    if _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            _fail(path, user_msg, f"lengths differ: {len(actual)} != {len(expected)}")
        for i, (a, b) in enumerate(zip(actual, expected, strict=True)):
            _compare(
                a, b, f"{path}[{i}]", user_msg,
                rtol, atol, equal_nan, exact_dtype, exact_device, floors,
            )
        return
    if actual is expected:
        return
    if type(actual) is not type(expected) and not (
        isinstance(actual, type(expected)) or isinstance(expected, type(actual))
    ):
        _fail(
            path, user_msg,
            f"types differ: {type(actual).__name__} != {type(expected).__name__} "
            f"({actual!r} != {expected!r})",
        )
    if not actual == expected:
        _fail(path, user_msg, f"{actual!r} != {expected!r}")


class TestCase(CaseParityMixin, expecttest.TestCase):
    """A unittest TestCase with tensor-aware equality and seeded RNGs.

    It has every method upstream's ``common_utils.TestCase`` adds to
    unittest's (:class:`~disttest.runners.case_parity.CaseParityMixin`).

    ``setUp`` seeds torch, numpy and ``random`` with ``seed`` (a class
    attribute, default :data:`DEFAULT_SEED`); the runners call it in every
    rank, so all ranks start from the same random state.
    """

    seed: int = DEFAULT_SEED

    def setUp(self) -> None:
        self._chain_reached = True
        super().setUp()
        set_rng_seed(settings.seed(self))

    def tearDown(self) -> None:
        self._chain_reached = True
        super().tearDown()

    def _callSetUp(self) -> None:
        self._resume_chain("setUp", super()._callSetUp)  # type: ignore[misc]

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
        # Upstream suites skip with sys.exit(TEST_SKIPS[key].exit_code); make
        # that a skip here too, not an error, so a plain test behaves as a rank.
        try:
            super()._callTestMethod(method)  # type: ignore[misc]
        except SystemExit as e:
            skip = skip_for_exit_code(e.code)
            if skip is None:
                raise
            raise DistSkip(skip) from None

    def assertEqual(
        self, first: Any, second: Any, msg: str | None = None, **options: Unpack[_EqualOptions]
    ) -> None:
        """Fail unless ``first`` equals ``second`` (see :func:`assert_equal`,
        whose keyword options ``rtol``, ``atol``, ``equal_nan``, ``exact_dtype``
        and ``exact_device`` it takes)."""
        # upstream's @precisionOverride/@toleranceOverride set these (CaseParityMixin).
        rel_tol, precision = getattr(self, "rel_tol", 0.0), getattr(self, "precision", 0.0)
        assert_equal(first, second, msg, **options, rtol_override=rel_tol, atol_override=precision)

    def assertGreaterAlmostEqual(
        self, first: float, second: float, places: int | None = None,
        msg: str | None = None, delta: float | None = None,
    ) -> None:
        """Fail unless ``first >= second``, or short of it by at most
        ``delta`` (or by nothing when rounded to ``places``, default 7)."""
        if delta is not None and places is not None:
            raise TypeError("specify delta or places, not both")
        if first >= second:
            return
        short = second - first
        if delta is not None:
            if short <= delta:
                return
            detail = f"{first} is not greater than or equal to {second} within {delta} delta"
        else:
            places = 7 if places is None else places
            if round(short, places) == 0:
                return
            detail = f"{first} is not greater than or equal to {second} within {places} places"
        raise self.failureException(self._formatMessage(msg, detail))

    def assertNotEqual(
        self, first: Any, second: Any, msg: str | None = None, **options: Unpack[_EqualOptions]
    ) -> None:
        """Fail if ``first`` equals ``second`` under :meth:`assertEqual`'s rules."""
        try:
            self.assertEqual(first, second, **options)
        except AssertionError:
            return
        raise self.failureException(
            msg or f"{first!r} == {second!r} (expected them to differ)"
        )

