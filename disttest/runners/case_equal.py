"""Equality as upstream's ``TestCase.assertEqual`` decides it.

torch's ``assert_close`` is built on a framework of comparison *pairs*
(``torch.testing._comparison``, reached through :mod:`disttest._compat`): a
pair type accepts inputs of one kind, compares them and words the mismatch;
the framework walks sequences and mappings and names the item that differs
("The failure occurred for item [1]['w']"). Upstream's
``common_utils.TestCase`` relaxes the strict pairs: a bool or a one-element
tensor against a number, a tensor against a numpy array, floats with
float32's tolerances, and strings, sets, types and any other object compared
by unittest's own ``assertEqual``. disttest builds the same relaxed pairs on
the same framework, so a migrated suite sees the same outcomes and messages.

Where upstream drops the user's ``msg`` (sequences of different lengths,
mappings with different keys, inputs no pair takes), disttest keeps it.
"""

from __future__ import annotations

import enum
import functools
import unittest
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from disttest import _compat

__unittest = True

__all__ = ["PAIR_TYPES", "assert_equal"]

# NB: the pairs have upstream's class names: torch's messages name them
# ("Originating a RelaxedNumberPair() at item [1] ...").

_cmp = _compat.comparison()

#: Python and numpy number types a bool or number may be compared against.
_NUMBERS: tuple[type, ...] = (int, float, complex, np.number)
_ARRAYS: tuple[type, ...] = (torch.Tensor, np.ndarray)
#: How a TypedStorage of a quantized dtype is read: as its integer bytes.
_QUANTIZED_AS = {
    torch.quint8: torch.uint8,
    torch.quint4x2: torch.uint8,
    torch.quint2x4: torch.uint8,
    torch.qint32: torch.int32,
    torch.qint8: torch.int8,
}


def _either_way(pair: Any, actual: Any, expected: Any, mine: tuple[type, ...], others: tuple[type, ...]) -> None:
    """Refuse the inputs (the next pair type is tried) unless one is of
    ``mine`` and the other of ``mine`` or ``others``."""
    both = (*mine, *others)
    if not (isinstance(actual, mine) and isinstance(expected, both)
            or isinstance(expected, mine) and isinstance(actual, both)):
        pair._inputs_not_supported()


def _single_item(pair: Any, value: Any, against: str, id: tuple[Any, ...]) -> Any:
    """The one element of a tensor or array (a ValueError for more)."""
    numel = value.numel() if isinstance(value, torch.Tensor) else value.size
    if numel > 1:
        pair._fail(ValueError, f"Only single element tensor-likes can be compared against a {against}. "
                               f"Got {numel} elements instead.", id=id)
    return value.item()


class RelaxedBooleanPair(_cmp.BooleanPair):  # type: ignore[misc,name-defined]
    """A bool against a bool, a number or a one-element tensor or array."""

    def _process_inputs(self, actual: Any, expected: Any, *, id: tuple[Any, ...]) -> list[bool]:
        _either_way(self, actual, expected, self._supported_types, (*_NUMBERS, *_ARRAYS))
        return [self._to_bool(value, id=id) for value in (actual, expected)]

    def _to_bool(self, value: Any, *, id: tuple[Any, ...]) -> bool:
        if isinstance(value, np.number):
            return bool(value.item())
        if type(value) in _NUMBERS:
            return bool(value)
        if isinstance(value, _ARRAYS):
            return bool(_single_item(self, value, "boolean", id))
        return bool(super()._to_bool(value, id=id))


class _Floors:
    """Raise a pair's tolerances to ``rtol_override``/``atol_override``."""

    rtol: float
    atol: float

    def _floor(self, rtol_override: float, atol_override: float) -> None:
        self.rtol = max(self.rtol, rtol_override)
        self.atol = max(self.atol, atol_override)


class RelaxedNumberPair(_Floors, _cmp.NumberPair):  # type: ignore[misc,name-defined]
    """A number against a number or a one-element tensor or array; an
    ``Enum`` as its int. Types are not checked (``1 == 1.0``), floats and
    complex numbers get float32's and complex64's tolerances, and
    ``rtol_override``/``atol_override`` raise the tolerances to at least
    themselves (upstream's ``@precisionOverride``/``@toleranceOverride``)."""

    _TYPE_TO_DTYPE = {int: torch.int64, float: torch.float32, complex: torch.complex64}

    def __init__(self, actual: Any, expected: Any, *, rtol_override: float = 0.0, atol_override: float = 0.0,
                 check_dtype: bool | None = None, **options: Any) -> None:
        super().__init__(actual, expected, check_dtype=False, **options)
        self._floor(rtol_override, atol_override)

    def _process_inputs(self, actual: Any, expected: Any, *, id: tuple[Any, ...]) -> list[Any]:
        _either_way(self, actual, expected, self._supported_types, _ARRAYS)
        return [self._to_number(value, id=id) for value in (actual, expected)]

    def _to_number(self, value: Any, *, id: tuple[Any, ...]) -> Any:
        if isinstance(value, _ARRAYS):
            number = _single_item(self, value, "number", id)
            return int(number) if isinstance(number, bool) else number
        if isinstance(value, enum.Enum):  # as upstream's: int() of any Enum (a float one's too)
            return int(value)  # type: ignore[call-overload]
        number = super()._to_number(value, id=id)
        if type(number) not in self._TYPE_TO_DTYPE:
            self._inputs_not_supported()
        return number


class TensorOrArrayPair(_Floors, _cmp.TensorLikePair):  # type: ignore[misc,name-defined]
    """Tensors and numpy arrays, in any mix: both sides become tensors."""

    def __init__(self, actual: Any, expected: Any, *, rtol_override: float = 0.0, atol_override: float = 0.0,
                 **options: Any) -> None:
        super().__init__(actual, expected, **options)
        self._floor(rtol_override, atol_override)

    def _process_inputs(self, actual: Any, expected: Any, *, id: tuple[Any, ...],
                        allow_subclasses: bool) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_inputs_isinstance(actual, expected, cls=_ARRAYS)
        actual, expected = (self._to_tensor(value) for value in (actual, expected))
        for tensor in (actual, expected):
            self._check_supported(tensor, id=id)
        return actual, expected


class TypedStoragePair(_Floors, _cmp.TensorLikePair):  # type: ignore[misc,name-defined]
    """Two ``TypedStorage``s, compared as tensors of their elements."""

    def __init__(self, actual: Any, expected: Any, *, rtol_override: float = 0.0, atol_override: float = 0.0,
                 **options: Any) -> None:
        self._check_inputs_isinstance(actual, expected, cls=torch.storage.TypedStorage)
        super().__init__(actual, expected, **options)
        self._floor(rtol_override, atol_override)

    def _to_tensor(self, storage: Any) -> torch.Tensor:
        return torch.tensor(_compat.typed_storage_bytes(storage),
                            dtype=_QUANTIZED_AS.get(storage.dtype, storage.dtype), device=storage.device)


class UnittestPair(_cmp.Pair):  # type: ignore[misc,name-defined]
    """Inputs of :attr:`kinds`, compared by ``unittest.TestCase.assertEqual``
    (its messages: a diff of strings, the items of sets that differ)."""

    kinds: type | tuple[type, ...] = object
    kind_name = "object"

    def __init__(self, actual: Any, expected: Any, **options: Any) -> None:
        self._check_inputs_isinstance(actual, expected, cls=self.kinds)
        super().__init__(actual, expected, **options)

    def compare(self) -> None:
        checker = unittest.TestCase()
        try:
            checker.assertEqual(self.actual, self.expected)
            return
        except checker.failureException as e:
            detail = str(e)
        self._fail(AssertionError, f"{self.kind_name.title()} comparison failed: {detail}")


class StringPair(UnittestPair):
    kinds = (str, bytes)
    kind_name = "string"


class SetPair(UnittestPair):
    kinds = set
    kind_name = "set"


class TypePair(UnittestPair):
    kinds = type
    kind_name = "type"


class ObjectPair(UnittestPair):
    pass


#: The pair types tried, in order, for two leaves; the first to accept them compares them.
PAIR_TYPES: tuple[type, ...] = (_cmp.NonePair, RelaxedBooleanPair, RelaxedNumberPair, TensorOrArrayPair, TypedStoragePair,
                                StringPair, SetPair, TypePair, ObjectPair)


@functools.cache
def _containers() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """The types walked item by item: sequences (modules' lists too) and mappings."""
    from torch.utils.data import Subset

    script_list, script_dict = _compat.script_containers()
    nn = torch.nn
    return ((Sequence, nn.Sequential, nn.ModuleList, nn.ParameterList, script_list, Subset),
            (Mapping, nn.ModuleDict, nn.ParameterDict, script_dict))


#: numpy's scalar types that have a torch dtype, as upstream lists them
#: (``numpy_to_torch_dtype_dict``): an array of another (``np.longlong``, a
#: string) compares element by element, as upstream's does.
_NUMPY_TYPES = frozenset({np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
                          np.int64, np.float16, np.float32, np.float64, np.complex64, np.complex128})


def _has_torch_dtype(dtype: np.dtype[Any]) -> bool:
    # NB: upstream looks the dtype up by its scalar type: np.longlong is not
    # np.int64 there (it is another type with the same width), so its arrays
    # compare item by item, as here.
    return dtype.type in _NUMPY_TYPES


def _as_list(value: Any) -> list[Any]:
    return value.tolist() if isinstance(value, (torch.Tensor, np.ndarray)) else list(value)


def _prepare(x: Any, y: Any) -> tuple[Any, Any]:
    """Make the inputs comparable as upstream's ``assertEqual`` does first."""
    # numpy has dtypes torch lacks (strings, objects): such arrays compare element by element.
    if any(isinstance(v, np.ndarray) and not _has_torch_dtype(v.dtype) for v in (x, y)):
        return _as_list(x), _as_list(y)
    # A sequence against a tensor becomes a tensor like it (the walk would
    # otherwise take the sequence item by item and the tensor whole).
    # NB: a str or bytes too, as upstream's: torch refuses it (a TypeError,
    # the test's error), where a failure would let assertNotEqual pass.
    if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
        y = torch.as_tensor(y, dtype=x.dtype, device=x.device)
    elif isinstance(y, torch.Tensor) and isinstance(x, Sequence):
        x = torch.as_tensor(x, dtype=y.dtype, device=y.device)
    # Nested tensors of the strided layout compare as their components.
    x, y = (v.unbind() if isinstance(v, torch.Tensor) and v.is_nested and v.layout == torch.strided else v
            for v in (x, y))
    return _compat.unwrap_dtensors(x, y)


def _with_message(msg: str | Callable[[str], str] | None) -> Callable[[str], str] | None:
    if isinstance(msg, str):
        return lambda generated: f"{generated}\n{msg}"
    return msg


#: A comparison that raised instead of deciding (upstream's words, which it raises as RuntimeError).
COMPARE_FAILED = ("Comparing\n\n{pair}\n\nresulted in the unexpected exception above. If you are a user and see "
                  "this message during normal operation please file an issue at "
                  "https://github.com/pytorch/pytorch/issues. If you are a developer and working on the "
                  "comparison functions, please except the previous error and raise an expressive `ErrorMeta` "
                  "instead.")

#: Leaf types whose equal values need no pair: ``==`` of the same type is
#: the pairs' verdict too (a NaN float is not ``==`` and takes the long way).
_PLAIN_LEAVES = frozenset({int, float, complex, bool, str, bytes, type(None)})


def _plainly_equal(x: Any, y: Any, exact_stride: bool) -> bool:
    """True only where the pairs would certainly find ``x`` and ``y`` equal
    (the common passing case, in a fraction of their time); False means
    "ask the pairs", not "different"."""
    kind = type(x)
    if kind is not type(y):
        return False
    if kind is torch.Tensor:
        try:
            return (x.layout == torch.strided and y.layout == torch.strided and x.dtype == y.dtype
                    and x.device == y.device and x.device.type != "meta" and not x.is_quantized
                    and not x.is_nested and not y.is_nested and x.shape == y.shape
                    and (not exact_stride or x.stride() == y.stride()) and bool(torch.equal(x, y)))
        except (RuntimeError, NotImplementedError, TypeError):
            return False  # (torch.equal has no kernel for every dtype: complex32) the pairs decide
    if kind in _PLAIN_LEAVES:
        return bool(x == y)
    if kind is list or kind is tuple:
        return len(x) == len(y) and all(_plainly_equal(a, b, exact_stride) for a, b in zip(x, y, strict=True))
    if kind is dict:
        return x.keys() == y.keys() and all(_plainly_equal(x[k], y[k], exact_stride) for k in x)
    return False


def _first_mismatch(actual: Any, expected: Any, options: dict[str, Any]) -> Any:
    """The first mismatch's ``ErrorMeta``, or None when the inputs are equal."""
    sequences, mappings = _containers()
    try:
        pairs = _cmp.originate_pairs(actual, expected, pair_types=PAIR_TYPES, sequence_types=sequences,
                                     mapping_types=mappings, **options)
    except _cmp.ErrorMeta as meta:
        return meta
    first = None
    # NB: every pair, as upstream's: one that cannot compare (an __eq__ that
    # raises) is an error even after an earlier item's mismatch.
    for pair in pairs:
        try:
            pair.compare()
        except _cmp.ErrorMeta as meta:
            first = first or meta
        except Exception as e:
            raise RuntimeError(COMPARE_FAILED.format(pair=pair)) from e
    return first


def assert_equal(
    actual: Any,
    expected: Any,
    msg: str | Callable[[str], str] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    exact_dtype: bool = True,
    exact_device: bool = False,
    exact_layout: bool = False,
    exact_stride: bool = False,
    exact_is_coalesced: bool = False,
    rtol_override: float = 0.0,
    atol_override: float = 0.0,
) -> None:
    """Assert that ``actual`` equals ``expected`` as upstream's
    ``TestCase.assertEqual`` decides it, recursing into sequences and mappings.

    Tensors and numpy arrays compare as ``torch.testing.assert_close`` does
    (tolerances from the dtypes unless ``rtol`` and ``atol`` are both given);
    a sequence against a tensor becomes a tensor of its dtype; a bool, number
    or one-element tensor against a number compares by value; ``None``,
    strings, sets, types and other objects by ``==`` with unittest's
    messages. The ``exact_*`` options check what their names say (a dtype
    that differs is otherwise promoted, a device moved to the CPU, a sparse
    layout made dense). A mismatch raises (usually ``AssertionError``) with
    torch's message, naming the item that differs; a string ``msg`` is added
    on a line after it, a callable one gets the message and returns the one
    raised. ``rtol_override``/``atol_override`` raise each comparison's
    tolerances to at least themselves, as upstream's
    ``TestCase.rel_tol``/``precision`` do.
    """
    if rtol is None and atol is None and _plainly_equal(actual, expected, exact_stride):
        return
    actual, expected = _prepare(actual, expected)
    meta = _first_mismatch(actual, expected, {
        "rtol": rtol, "atol": atol, "rtol_override": rtol_override, "atol_override": atol_override,
        "equal_nan": equal_nan, "check_device": exact_device, "check_dtype": exact_dtype,
        "check_layout": exact_layout, "check_stride": exact_stride, "check_is_coalesced": exact_is_coalesced,
    })
    if meta is not None:
        raise meta.to_error(_with_message(msg)) from None
