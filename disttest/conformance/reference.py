"""Each rank's deterministic input and the expected results, in numpy.

Nothing here calls a collective or torch's reductions: expected values come
from numpy (or plain Python) applied to the inputs every rank can compute
for every other rank, so the suite never checks a backend against itself.
Inputs are small positive integers (1 to 5) in every dtype, so sums,
products and averages of a few ranks are exact or nearly so even in
bfloat16, and every reduce op gives a result that tells it from the others.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """``values`` as a fresh torch tensor of ``dtype``."""
    return torch.from_numpy(np.array(values, copy=True)).to(DTYPES[dtype][0])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in numpy (bfloat16 as float32)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return np.array(t.numpy(), copy=True)


def expected_reduce(op: str, arrays: Sequence[np.ndarray], dtype: str) -> np.ndarray:
    """``arrays`` (one per rank) reduced under ``op``, in plain numpy."""
    np_dtype = DTYPES[dtype][1]
    if dtype == "bool":
        stacked = np.stack(arrays)
        logical = {"SUM": np.any, "MAX": np.any, "BOR": np.any, "PRODUCT": np.all, "MIN": np.all, "BAND": np.all}
        if op in logical:
            return cast(np.ndarray, logical[op](stacked, axis=0))
        if op == "BXOR":
            return cast(np.ndarray, (stacked.sum(axis=0) % 2).astype(np.bool_))
        raise ValueError(f"reduce op {op} is not defined on bool")
    wide = np.complex128 if dtype == "complex64" else np.float64 if dtype in FLOATS else np.int64
    stacked = np.stack([np.asarray(a, dtype=wide) for a in arrays])
    if op == "SUM":
        out = stacked.sum(axis=0)
    elif op == "PRODUCT":
        out = stacked.prod(axis=0)
    elif op == "MIN":
        out = stacked.min(axis=0)
    elif op == "MAX":
        out = stacked.max(axis=0)
    elif op == "AVG":
        out = stacked.sum(axis=0) / len(arrays)
    elif op == "PREMUL_SUM":
        out = (stacked * PREMUL_FACTOR).sum(axis=0)
    elif op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        out = fn.reduce(stacked, axis=0)
    else:
        raise ValueError(f"unknown reduce op {op!r}")
    return np.asarray(out).astype(np_dtype)


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
