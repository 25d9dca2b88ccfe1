"""Example: a torchrun multi-node invocation, two "nodes" on loopback.

Starts two torchrun agents (--nnodes=2, one process each), as two machines
would, running examples/multinode/pooled_ops.py; each process runs the
class's tests as its rank through MultiProcContinousTest.run_rank.
Run: python -m unittest -v examples/test_torchrun_two_nodes.py
"""

import os
import subprocess
import sys
import tempfile
import unittest

import disttest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multinode", "pooled_ops.py")


class TwoNodes(unittest.TestCase):
    def test_both_nodes_pass(self):
        port = str(disttest.find_free_port())
        # torchrun writes its logs to a new folder in the temp folder and leaves it there.
        logs = tempfile.TemporaryDirectory(prefix="torchrun-logs-")
        self.addCleanup(logs.cleanup)
        nodes = [
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                 f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}",
                 f"--log-dir={logs.name}", SCRIPT],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=dict(os.environ, OMP_NUM_THREADS="1"))
            for node in (0, 1)
        ]
        try:
            outputs = [node.communicate(timeout=120)[0] for node in nodes]
        finally:
            for node in nodes:  # a node that failed must not leave the other waiting
                node.kill()
        for node, out in zip(nodes, outputs, strict=True):
            self.assertEqual(node.returncode, 0, out[-3000:])
            self.assertIn("Ran 2 tests", out)


if __name__ == "__main__":
    unittest.main()
