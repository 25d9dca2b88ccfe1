"""The conformance suite on NCCL (world size 1) and on gloo with CUDA
tensors (world size 2, ``--device cuda``). Run by ``make gpu-check``;
skipped where CUDA is absent.

What each backend lacks by design is declared in disttest's table
(``disttest.conformance.UNSUPPORTED``: ``nccl`` and ``gloo/cuda``). What a
run on a GPU found wrong is listed below, each an upstream bug, with what
was seen (an H100, torch 2.11.0+cu130, and again an H200, 2026-11-27;
benchmarks/RESULTS.rst, "On a GPU"):
the test accepts those failures, and fails on any other, so a new bug or a
regression of disttest's shows, and a fixed bug does not break it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.gpu

PREMUL_AT_ONE = "NCCL at world size 1: PREMUL_SUM does not apply its factor (1.0 where 2.0)"

ALLTOALL = "gloo with CUDA tensors: 'Backend gloo does not support alltoall'"
WRITEV = ("gloo with CUDA tensors: 'writev ...: Bad address' (the device pointer goes to the socket), then the "
          "peer's 'Connection closed by peer'")

#: backend -> the case names that failed on the GPU run -> what was seen.
KNOWN_BUGS: dict[str, dict[str, str]] = {
    "nccl": {
        "test_all_reduce__bfloat16_PREMUL_SUM": "NCCL at world size 1: PREMUL_SUM on bfloat16 gives 0.0 where 2.0",
        "test_reduce_scatter__float32_PREMUL_SUM": PREMUL_AT_ONE,
        "test_reduce_scatter_tensor__float32_PREMUL_SUM": PREMUL_AT_ONE,
    },
    "gloo": {
        "test_all_gather_coalesced__float32": "gloo with CUDA tensors: both ranks die of SIGSEGV in it",
        **dict.fromkeys(("test_all_to_all__bool", "test_all_to_all__float32_async", "test_all_to_all__float64",
                         "test_all_to_all__int64"), ALLTOALL),
        **dict.fromkeys(("test_send_recv__bool", "test_send_recv__float32_batch_isend_irecv",
                         "test_send_recv__float32_nonblocking", "test_send_recv__float32_size1",
                         "test_send_recv__float64", "test_send_recv__int64", "test_send_recv__recv_any_source",
                         "test_send_recv__tags", "test_async_completion__irecv_waits_for_data"), WRITEV),
    },
}


def known_bug(backend: str, name: str) -> str | None:
    return KNOWN_BUGS[backend].get(name)


def conformance(backend: str, world_size: int, *args: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        proc = subprocess.run([sys.executable, "-m", "disttest.conformance", "--backend", backend, "--world-size",
                               str(world_size), "--timeout", "60", "--json", path, *args],
                              capture_output=True, text=True, timeout=600)
        assert os.path.exists(path), proc.stdout[-4000:] + proc.stderr[-4000:]
        with open(path) as f:
            report = json.load(f)
    failed = [c["name"] for c in report["cases"] if c["status"] == "failed"]
    unexpected = [c for c in report["cases"] if c["name"] in failed and not known_bug(backend, c["name"])]
    assert unexpected == [], "\n".join(f"{c['name']}: {c['message'][-800:]}" for c in unexpected)
    assert proc.returncode == (1 if failed else 0), proc.stdout[-4000:]
    return report


def test_nccl_world_size_1() -> None:
    report = conformance("nccl", 1)
    assert report["device"] == "cuda"  # NCCL's default: it takes nothing else
    assert report["counts"]["passed"] >= 150, report["counts"]  # 159 on the H100 run


def test_gloo_with_cuda_tensors_world_size_2() -> None:
    report = conformance("gloo", 2, "--device", "cuda")
    assert report["device"] == "cuda"
    assert report["counts"]["passed"] >= 190, report["counts"]  # 200 on the H100 run
