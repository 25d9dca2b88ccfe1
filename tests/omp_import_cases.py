"""A module that runs a parallel op at import (as suites that build a
tensor constant with a matmul do), then fresh-process tests whose ranks keep
OpenMP's threads (``rank_threads = None``) and ranks that do not.

tests/test_fork_server.py runs it with ``python -m unittest`` in a new
process, under ``DISTTEST_FORK_SERVER=fresh``: the fork server imports it,
and its OpenMP pool starts there. A rank forked after that hangs at its
first parallel op (libgomp is not fork-safe), so the server refuses to fork
the first class's ranks, which start with ``spawn`` instead; the second
class's ranks go serial before any op and are forked. Never imported by
pytest's process (a parallel op there would start its pool).
"""

from __future__ import annotations

import unittest

import torch
from omp_clean_cases import OneRank

_ = torch.randn(1500, 1500) @ torch.randn(1500, 1500)  # a parallel op at import


class OmpRanks(OneRank):
    """Ranks that keep OpenMP's threads: spawned, and their parallel ops run."""

    def test_a(self) -> None:
        self.check(forked=False)

    def test_b(self) -> None:  # the module is known by now: no fork server is asked
        self.check(forked=False)


class SerialRanks(OneRank):
    """Ranks of one OpenMP thread (the default) are forked by the fork server."""

    rank_threads = 1

    def test_forked(self) -> None:
        self.check(forked=True)


if __name__ == "__main__":
    unittest.main()
