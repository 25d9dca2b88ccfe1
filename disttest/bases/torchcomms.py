"""Upstream's torchcomms test base and group (``common_distributed``'s
``C10dTorchCommsTestBase`` and ``setup_torchcomms_pg``), for torchcomms, the
separately installed communication library torch can route c10d through.

Without torchcomms (any machine where it is not installed) the base's tests
skip naming the backend, and ``setup_torchcomms_pg`` raises ``SkipTest``.
torchcomms is imported only when a test needs it.
"""

from __future__ import annotations

import os
import unittest
from typing import Any

from disttest import _compat
from disttest.config import DEFAULT_WORLD_SIZE
from disttest.runners.continuous import MultiProcContinousTest
from disttest.support import platform
from disttest.support.stores import find_free_port

__unittest = True

__all__ = ["NO_TORCHCOMMS", "C10dTorchCommsTestBase", "setup_torchcomms_pg"]

NO_TORCHCOMMS = "torchcomms {backend} backend is not available"
_FLAGS = {"gloo": "TORCHCOMM_HAS_GLOO", "xccl": "TORCHCOMM_HAS_XCCL", "nccl": "TORCHCOMM_HAS_NCCL",
          "rccl": "TORCHCOMM_HAS_RCCL", "ncclx": "TORCHCOMM_HAS_NCCLX", "rcclx": "TORCHCOMM_HAS_RCCLX"}


def setup_torchcomms_pg(backend: str, rank: int, world_size: int, device: Any, store_path: str,
                        group_name: str) -> Any:
    """A bare ProcessGroup whose backend is a torchcomms comm of ``backend``
    (``nccl``, ``ncclx``...), registered under ``group_name`` so name-based
    lookups find it; the rendezvous goes through the FileStore at
    ``store_path``. ``group_name`` (and ``store_path``) must be unique in the
    process. Skips (``SkipTest``) where torchcomms is not installed."""
    flag = _FLAGS.get(backend)
    if flag is None or not getattr(platform, flag):
        raise unittest.SkipTest(NO_TORCHCOMMS.format(backend=backend))
    os.environ["TORCHCOMM_RANK"] = str(rank)
    os.environ["TORCHCOMM_SIZE"] = str(world_size)
    return _compat.torchcomms_process_group(backend, rank, world_size, device, store_path, group_name)


class C10dTorchCommsTestBase(MultiProcContinousTest):
    """A pool whose group runs over torchcomms (``torch.distributed.config.
    use_torchcomms``, set in the ranks only): nccl on CUDA, xccl on XPU,
    hccl on HPU, gloo on CPU. A test skips, before its ranks run it, when
    torchcomms lacks the backend."""

    world_size: int = DEFAULT_WORLD_SIZE

    @staticmethod
    def backend(device: str) -> str:
        """The backend for ``device`` (``"cuda:0"`` -> ``nccl``)."""
        for kind, name in (("cuda", "nccl"), ("hpu", "hccl"), ("xpu", "xccl")):
            if kind in device:
                return name
        return "gloo"

    @classmethod
    def backend_str(cls) -> str:
        # (instantiate_device_type_tests makes ``device_type`` a string on the classes it makes)
        device_type = cls.device_type
        return cls.backend(str(device_type() if callable(device_type) else device_type))

    def _skip_if_backend_unavailable(self, device: str) -> None:
        name = self.backend(device)
        flag = _FLAGS.get(name)
        if flag is not None and not getattr(platform, flag):
            self.skipTest(NO_TORCHCOMMS.format(backend=name))

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        """Hook, in a rank: torchcomms on, its environment set, then the group."""
        import torch

        _compat.use_torchcomms(True)
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", str(find_free_port()))
        os.environ["TORCHCOMM_RANK"] = str(rank)
        os.environ["TORCHCOMM_SIZE"] = str(world_size)
        if rdvz_file is not None:
            os.environ["TORCHCOMM_STORE_PATH"] = rdvz_file
        super()._init_pg(rank, world_size, rdvz_file)
        backend = cls.backend_str()
        if backend in ("nccl", "xccl"):
            accelerator = torch.accelerator.current_accelerator()
            if accelerator is None:
                raise RuntimeError(f"Expected to find an accelerator when initializing process group with "
                                   f"{backend} backend, but got None")
            device = torch.device(f"{accelerator.type}:{rank}")
            torch.set_default_device(device)
            torch.accelerator.set_device_index(device)

    @classmethod
    def setUpClass(cls) -> None:
        # Decided before the pool starts: without the backend no rank can make the group.
        flag = _FLAGS.get(cls.backend_str())
        if flag is not None and not getattr(platform, flag):
            raise unittest.SkipTest(NO_TORCHCOMMS.format(backend=cls.backend_str()))
        super().setUpClass()

    def rank_to_device(self, device: str) -> dict[int, list[int]]:
        """Each rank's device indices (rank modulo the visible devices)."""
        import torch

        count = torch.get_device_module(device).device_count()
        return {i: [i % count] for i in range(self.world_size)}
