"""disttest's runners under upstream's ``instantiate_device_type_tests``
(tests/test_case.py runs this module in a subprocess: importing torch's
test helpers changes process-wide state that other tests must not see).

The classes it makes put ``common_utils.TestCase``, whose ``setUp`` and
``tearDown`` call no ``super()``, before disttest's bases; a generic class
without a ``setUp`` of its own (the usual ``DistributedTestBase`` suite)
relies on disttest's to start its ranks.
"""

import torch
import torch.distributed as dist
from torch.testing._internal.common_device_type import instantiate_device_type_tests

import disttest


class Collect(disttest.DistributedTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def test_sum(self, device):
        self.create_pg(device)
        t = torch.ones(2, device=device) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 3.0))


instantiate_device_type_tests(Collect, globals(), only_for="cpu")
