"""One DTensor body run simulated, as threads and as processes
(tests/test_simulated.py). With ``OUT_ENV`` set, every rank saves what it
computed there, so the test can compare the three runs rank by rank."""

import os

import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import disttest
from disttest import _compat

OUT_ENV = "DISTTEST_SIMULATED_CASES_OUT"


def block(x, row, col, size=4):
    """The ``size`` x ``size`` block of ``x`` at block row ``row``, column ``col``."""
    return x[row * size:(row + 1) * size, col * size:(col + 1) * size]


def coords(rank):
    """``rank``'s coordinate on the row-major 2x2x2 mesh."""
    return rank // 4, (rank // 2) % 2, rank % 2


@disttest.run_in("threads", "processes")
@disttest.run_simulated
class Redistribute(disttest.SpmdMixin):
    world_size = 8
    timeout = 120

    def test_redistribute(self):
        mesh = self.mesh(2, 2, 2)
        x = torch.arange(64.0).reshape(8, 8)
        whole = self.replicated(x)  # a plain tensor in every mode
        d = distribute_tensor(x, mesh, [Shard(0), Shard(1), Replicate()])
        self.assertRanksEqual(d.to_local(), lambda r: block(whole, coords(r)[0], coords(r)[1]))
        moved = d.redistribute(mesh, [Replicate(), Shard(0), Shard(1)])
        self.assertRanksEqual(moved.to_local(), lambda r: block(whole, coords(r)[1], coords(r)[2]))
        full = moved.full_tensor()
        self.assertRanksEqual(full, x)
        self.save({"distributed": d.to_local(), "redistributed": moved.to_local(), "full": full})

    def test_rank_five_is_off_by_one(self):
        mesh = self.mesh(2, 2, 2)
        x = torch.arange(64.0).reshape(8, 8)
        whole = self.replicated(x)
        d = distribute_tensor(x, mesh, [Shard(0), Shard(1), Replicate()])
        self.assertRanksEqual(d.to_local(), lambda r: block(whole, *coords(r)[:2]) + (r == 5))

    def save(self, values):
        out = os.environ.get(OUT_ENV)
        if not out:
            return
        lt = _compat.local_tensor()
        mode = type(self).__name__.rsplit("_", 1)[1]
        with lt.maybe_disable_local_tensor_mode():
            per_rank = {name: self.rank_values(v) for name, v in values.items()}
            for rank in per_rank["full"]:
                torch.save({name: v[rank].clone() for name, v in per_rank.items()},
                           os.path.join(out, f"{mode}-{rank}.pt"))
