"""What a test can observe of the rank it runs in, as plain data.

:func:`look` is called in a rank (a process or a thread) by a test body and
returns a JSON-able dict: environment, interpreter and torch state, c10d's
backends, logging, warnings, signals, faulthandler and the attributes the
runner set on the case. tests/test_rank_look.py compares items of it with
what upstream's harness gives its ranks (see "What a rank looks like" in
docs/explanation/design.rst). To audit again (a new torch): call it first
thing in a test body under upstream's runners and disttest's, and diff.
"""

from __future__ import annotations

import faulthandler
import hashlib
import logging
import os
import random
import signal
import sys
import threading
import warnings
from typing import Any

#: Prefixes of the environment variables that distributed code reads.
DIST_ENV = ("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "TORCH", "NCCL_", "GLOO_", "OMP_",
            "CUDA_VISIBLE", "PYTORCH", "TORCHELASTIC", "TEMP_DIR", "INIT_METHOD", "BACKEND")
SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGPIPE", "SIGHUP", "SIGQUIT", "SIGALRM")


def _digest(obj: object) -> str:
    return hashlib.sha1(repr(obj).encode()).hexdigest()[:10]


def _handler(h: object) -> str:
    if h is None:
        return "None (not set from Python)"
    if isinstance(h, int):
        return {int(signal.SIG_DFL): "SIG_DFL", int(signal.SIG_IGN): "SIG_IGN"}.get(int(h), str(h))
    return f"{getattr(h, '__module__', '?')}.{getattr(h, '__qualname__', repr(h))}"


def look(case: Any) -> dict[str, Any]:
    """What the test ``case`` can observe, called first thing in its body."""
    import numpy as np
    import torch
    import torch.distributed as dist

    env = dict(os.environ)
    out: dict[str, Any] = {
        "env": env,
        "env.dist": {k: v for k, v in sorted(env.items()) if k.startswith(DIST_ENV)},
        "sys.argv": list(sys.argv),
        "cwd": os.getcwd(),
        "process.is_main_thread": threading.current_thread() is threading.main_thread(),
        "process.thread_name": threading.current_thread().name,
        "process.own_pgid": os.getpgid(0) == os.getpid(),
        "process.sched": os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None,
        "torch.default_device": str(torch.get_default_device()),
        "torch.default_dtype": str(torch.get_default_dtype()),
        "torch.num_threads": torch.get_num_threads(),
        "torch.num_interop_threads": torch.get_num_interop_threads(),
        "torch.grad_enabled": torch.is_grad_enabled(),
        "torch.deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch.backends_flags_frozen": torch.backends.flags_frozen(),
        "torch.autograd_multithreading": torch.autograd.is_multithreading_enabled(),
        "torch.mp_start_method": torch.multiprocessing.get_start_method(allow_none=True),
        "seed.torch_initial": torch.initial_seed(),
        "seed.torch_state": _digest(torch.get_rng_state().tolist()),
        "seed.random_state": _digest(random.getstate()),
        "seed.numpy_state": _digest(np.random.get_state()[1].tolist()),
        "dist.backend_list": list(dist.Backend.backend_list),
        "dist.plugins": sorted(dist.Backend._plugins),
        "dist.is_initialized": dist.is_initialized(),
        "dist.backend": dist.get_backend() if dist.is_initialized() else None,
        "dist.debug_level": str(dist.get_debug_level()),
        "logging.root_level": logging.getLevelName(logging.getLogger().level),
        "logging.root_handlers": [f"{type(h).__module__}.{type(h).__qualname__}"
                                  for h in logging.getLogger().handlers],
        # Loggers other than the root that hold a handler of pytest's (it
        # attaches to every logger that does not propagate: c10d's).
        "logging.runner_handlers_elsewhere": sorted(
            name for name, lg in logging.root.manager.loggerDict.items()
            if isinstance(lg, logging.Logger) and any(type(h).__module__.startswith("_pytest.") for h in lg.handlers)),
        "logging.torch_distributed_level": logging.getLevelName(
            logging.getLogger("torch.distributed").getEffectiveLevel()),
        "warnings.filters": [f"{a} {c.__name__} {getattr(m, 'pattern', m) or ''} {getattr(mod, 'pattern', mod) or ''}"
                             for a, m, c, mod, _ in warnings.filters][:12],
        "warnings.n_filters": len(warnings.filters),
        # A warning goes to a list nobody reads (pytest's recording, copied by a fork).
        "warnings.recorded": (getattr(warnings._showwarnmsg_impl, "__module__", None) != "warnings"
                              and warnings.showwarning is warnings._showwarning_orig),
        "signals": {name: _handler(signal.getsignal(getattr(signal, name))) for name in SIGNALS},
        "faulthandler.enabled": faulthandler.is_enabled(),
        "sys.excepthook": _handler(sys.excepthook),
        "threading.excepthook": _handler(threading.excepthook),
        "sys.stdout": type(sys.stdout).__name__,
        "sys.stdout_is_dunder": sys.stdout is sys.__stdout__,
        "case.rank": getattr(case, "rank", "<unset>"),
        "case.world_size": getattr(case, "world_size", "<unset>"),
        "case.file_name_exists": os.path.exists(getattr(case, "file_name", "") or ""),
        "case.destroy_pg_upon_exit": getattr(case, "destroy_pg_upon_exit", "<unset>"),
        "case.attrs": sorted(getattr(case, "__dict__", {})),
        "case.is_master": getattr(case, "is_master", "<unset>"),
    }
    return out


def seeded(seed: int) -> dict[str, Any]:
    """The ``seed.*`` items of :func:`look` in a process or thread whose
    torch, ``random`` and numpy generators were just seeded with ``seed``."""
    import numpy as np
    import torch

    return {
        "seed.torch_initial": seed,
        "seed.torch_state": _digest(torch.Generator().manual_seed(seed).get_state().tolist()),
        "seed.random_state": _digest(random.Random(seed).getstate()),
        "seed.numpy_state": _digest(np.random.RandomState(seed).get_state()[1].tolist()),
    }
