"""Example: checkpoint/resume training survives a rank killed mid-training.

A pool of two gloo ranks trains a tiny linear model, averaging gradients
with all_reduce and checkpointing every 2 steps. In the first test rank 1
is killed (SIGKILL) as it enters its 5th all_reduce: rank 0 sees the
collective fail and stops; the injected death is expected, so the test
passes when rank 0 does. The pool replaces the dead rank before the second
test, which resumes from the last checkpoint (step 4) and must end with the
same weights as an uninterrupted run.
Run: python -m unittest -v examples/test_fault_checkpoint_resume.py
"""

import os
import shutil
import tempfile
import unittest

import torch
import torch.distributed as dist

import disttest

STEPS = 8
EVERY = 2  # checkpoint every EVERY steps
LR = 0.1


def batch(step, rank):
    """This rank's data for one step (the same on every run)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 3, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5])


def local_grad(w, step, rank):
    x, y = batch(step, rank)
    return 2 * x.T @ (x @ w - y) / len(x)


def train(w, start, ckpt, rank, world):
    """Steps start+1..STEPS; rank 0 saves a checkpoint every EVERY steps.
    Returns the step it stopped at (STEPS, or the step whose all_reduce failed)."""
    for step in range(start + 1, STEPS + 1):
        g = local_grad(w, step, rank)
        try:
            dist.all_reduce(g)
        except RuntimeError:
            return step  # a peer died: leave; a fresh group resumes from the checkpoint
        w = w - LR * g / world
        if step % EVERY == 0 and rank == 0:
            torch.save({"step": step, "w": w}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    return STEPS


def reference():
    """The same training in one process, never interrupted."""
    w = torch.zeros(3)
    for step in range(1, STEPS + 1):
        w = w - LR * sum(local_grad(w, step, r) for r in range(2)) / 2
    return w


class CheckpointedTraining(disttest.MultiProcContinousTest):
    world_size = 2
    timeout = 60

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The ranks take the parent's environment when the pool starts.
        os.environ["CKPT_DIR"] = tempfile.mkdtemp(prefix="ckpt-")

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(os.environ.pop("CKPT_DIR"), ignore_errors=True)

    @property
    def ckpt(self):
        return os.path.join(os.environ["CKPT_DIR"], "model.pt")

    @disttest.inject_fault(rank=1, action="kill", at="all_reduce", nth=5)
    def test_1_a_rank_dies_at_step_5(self):
        stopped = train(torch.zeros(3), 0, self.ckpt, self.rank, self.world_size)
        # Only rank 0 reports (rank 1 is dead): it stopped at step 5, after
        # the checkpoint of step 4.
        self.assertEqual(stopped, 5)
        self.assertEqual(torch.load(self.ckpt)["step"], 4)

    def test_2_resume_from_the_checkpoint(self):
        # A whole group again: the pool replaced the killed rank.
        self.assertEqual(dist.get_world_size(), 2)
        state = torch.load(self.ckpt)
        self.assertEqual(state["step"], 4)
        dist.barrier()  # every rank has read step 4 before rank 0 writes on
        stopped = train(state["w"], state["step"], self.ckpt, self.rank, self.world_size)
        self.assertEqual(stopped, STEPS)
        if self.rank == 0:
            self.assertEqual(torch.load(self.ckpt)["w"], reference())


if __name__ == "__main__":
    unittest.main()
