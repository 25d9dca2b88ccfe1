"""The example backend (store_backend.py) passes disttest's conformance suite.

The same check a backend author runs by hand::

    python -m disttest.conformance --backend storepg --world-size 3 --import store_backend
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


class StoreBackendConformance(unittest.TestCase):
    def test_every_case_passes_or_is_declared(self):
        proc = subprocess.run(
            [sys.executable, "-m", "disttest.conformance", "--backend", "storepg", "--world-size", "3",
             "--import", "store_backend"],
            cwd=HERE, capture_output=True, text=True, timeout=300,
        )
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
        self.assertEqual(proc.returncode, 0, proc.stdout[-5000:] + proc.stderr[-2000:])
        self.assertRegex(summary, r"conformance of backend 'storepg', world size 3: \d+ passed, 0 failed, "
                                  r"\d+ unsupported, 0 skipped")
        self.assertIn("UNSUPPORTED test_send_recv__recv_any_source: declared unsupported: recv_any_source "
                      "(not implemented in this example)", proc.stdout)


if __name__ == "__main__":
    unittest.main()
