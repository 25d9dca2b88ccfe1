"""Each rank's deterministic input and the expected results, in numpy.

Nothing here calls a collective or torch's reductions: expected values come
from numpy (or plain Python) applied to the inputs every rank can compute
for every other rank, so the suite never checks a backend against itself.
Inputs are small positive integers (1 to 5) in every dtype, so sums,
products and averages of a few ranks are exact or nearly so even in
bfloat16, and every reduce op gives a result that tells it from the others.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import torch

__unittest = True

__all__ = ["DTYPES", "OPS", "PREMUL_FACTOR", "expected_reduce", "op_defined", "rank_input", "to_numpy", "to_torch"]

#: dtype name -> (torch dtype, numpy dtype used to hold its values)
DTYPES: dict[str, tuple[torch.dtype, Any]] = {
    "float16": (torch.float16, np.float16),
    "bfloat16": (torch.bfloat16, np.float32),  # numpy has no bfloat16; the values are exact in it
    "float32": (torch.float32, np.float32),
    "float64": (torch.float64, np.float64),
    "int8": (torch.int8, np.int8),
    "uint8": (torch.uint8, np.uint8),
    "int32": (torch.int32, np.int32),
    "int64": (torch.int64, np.int64),
    "bool": (torch.bool, np.bool_),
    "complex64": (torch.complex64, np.complex64),
}
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM", "BAND", "BOR", "BXOR")
PREMUL_FACTOR = 2.0
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")

#: (rtol, atol) per dtype; integer and bool results must be exact.
TOLERANCE = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (1e-6, 1e-6),
             "float64": (1e-12, 1e-12), "complex64": (1e-6, 1e-6)}


def op_defined(op: str, dtype: str) -> bool:
    """Whether reduce op ``op`` is defined on ``dtype`` (as c10d and NCCL define it)."""
    if dtype in FLOATS:
        return op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
    if dtype in INTS:
        return op in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
    if dtype == "bool":
        return op in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
    if dtype == "complex64":
        return op in ("SUM", "AVG", "PREMUL_SUM")
    return False


def rank_input(rank: int, n: int, dtype: str, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input of ``n`` elements (numpy), for a case's ``salt``."""
    i = np.arange(n, dtype=np.int64)
    base = (i * 7 + rank * 3 + salt * 5) % 5 + 1
    if dtype == "bool":
        return cast(np.ndarray, ((i + rank + salt) % 3 != 0).astype(np.bool_))
    if dtype == "complex64":
        return (base + 1j * ((i + 2 * rank + salt) % 3)).astype(np.complex64)
    return base.astype(DTYPES[dtype][1])


def to_torch(values: np.ndarray, dtype: str) -> torch.Tensor:
    """``values`` as a fresh torch tensor of ``dtype``, on the device that
    factory functions use here (a ``with torch.device(...)`` block's:
    ``torch.from_numpy`` itself always gives a CPU tensor)."""
    device = torch.empty(0).device
    return torch.from_numpy(np.array(values, copy=True)).to(device=device, dtype=DTYPES[dtype][0])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in numpy (bfloat16 as float32)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return np.array(t.numpy(), copy=True)


#: How each reduce op folds one more input in (bool: the logical ops).
_FOLD = {"SUM": np.add, "AVG": np.add, "PREMUL_SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum,
         "MAX": np.maximum, "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
_FOLD_BOOL = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or, "PRODUCT": np.logical_and,
              "MIN": np.logical_and, "BAND": np.logical_and, "BXOR": np.logical_xor}


def expected_reduce(op: str, arrays: Iterable[np.ndarray], dtype: str) -> np.ndarray:
    """``arrays`` (one per rank) reduced under ``op``, in plain numpy, in a
    wide type, one input at a time (memory of one input, however many ranks)."""
    np_dtype = DTYPES[dtype][1]
    fold: Any
    wide: Any
    if dtype == "bool":
        if op not in _FOLD_BOOL:
            raise ValueError(f"reduce op {op} is not defined on bool")
        fold, wide = _FOLD_BOOL[op], np.bool_
    elif op in _FOLD:
        fold = _FOLD[op]
        wide = np.complex128 if dtype == "complex64" else np.float64 if dtype in FLOATS else np.int64
    else:
        raise ValueError(f"unknown reduce op {op!r}")
    acc: Any = None
    count = 0
    for a in arrays:
        a = np.asarray(a, dtype=wide)
        if op == "PREMUL_SUM":
            a = a * PREMUL_FACTOR
        acc = a if acc is None else fold(acc, a)
        count += 1
    if op == "AVG":
        acc = acc / count
    return np.asarray(acc).astype(np_dtype)


@functools.lru_cache(maxsize=32)
def expected_reduce_of(op: str, ranks: tuple[int, ...], n: int, dtype: str, salt: int) -> np.ndarray:
    """:func:`expected_reduce` of the inputs of ``ranks`` (:func:`rank_input`
    of ``n`` elements, ``salt``), once per process: every rank of a wide world
    asks the same (64 thread ranks, each with a list of every rank's input of
    1M elements, took 24 GB). Read-only: the array is shared."""
    out = expected_reduce(op, (rank_input(r, n, dtype, salt) for r in ranks), dtype)
    out.flags.writeable = False
    return out


def mismatch(got: np.ndarray, want: np.ndarray, dtype: str) -> str | None:
    """None if ``got`` matches ``want``; else a description of the first difference."""
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if dtype in TOLERANCE:
        rtol, atol = TOLERANCE[dtype]
        bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    else:
        bad = got != want
    if not bad.any():
        return None
    idx = np.flatnonzero(bad.reshape(-1))
    first = int(idx[0])
    return (f"{len(idx)} of {got.size} elements differ; first at index {first}: "
            f"got {got.reshape(-1)[first]!r}, expected {want.reshape(-1)[first]!r}")
