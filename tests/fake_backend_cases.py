"""A suite ported from upstream by its imports alone: ``FakeStore`` from
disttest, ``init_process_group("fake")`` in a one-process TestCase, in
``setUpClass`` and in a test (test_case.py runs it in a fresh interpreter,
where nothing registered the backend before)."""

import torch
import torch.distributed as dist

import disttest
from disttest import FakeStore


class ClassWorld(disttest.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=16)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        super().tearDownClass()

    def test_world(self):
        self.assertEqual(dist.get_world_size(), 16)
        self.assertEqual(dist.get_backend(), "fake")


class TestWorld(disttest.TestCase):
    def test_world(self):
        dist.init_process_group(backend="fake", store=FakeStore(), rank=3, world_size=8)
        self.addCleanup(dist.destroy_process_group)
        t = torch.ones(2)
        dist.all_reduce(t)  # communicates nothing
        self.assertEqual(dist.get_rank(), 3)
