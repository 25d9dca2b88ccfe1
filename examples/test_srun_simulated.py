"""Example: the pooled class under Slurm, simulated on this machine.

srun starts one process per task and tells each its place through SLURM_*
variables; this starts two local processes with the variables srun would set
for a 2-task step on one node ("localhost"), running
examples/multinode/pooled_ops.py, whose run_rank() reads them. On a cluster
the same script runs under `sbatch examples/multinode/srun.sbatch`.
Run: python -m unittest -v examples/test_srun_simulated.py
"""

import os
import subprocess
import sys
import unittest

import disttest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multinode", "pooled_ops.py")


class SimulatedSrun(unittest.TestCase):
    def test_two_tasks_pass(self):
        base = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
        base.update(OMP_NUM_THREADS="1", SLURM_NTASKS="2", SLURM_STEP_NODELIST="localhost",
                    SLURM_JOB_ID="4242", MASTER_PORT=str(disttest.find_free_port()))
        tasks = [
            subprocess.Popen([sys.executable, SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=dict(base, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)))
            for i in range(2)
        ]
        try:
            outputs = [task.communicate(timeout=120)[0] for task in tasks]
        finally:
            for task in tasks:  # a task that failed must not leave the other waiting
                task.kill()
        for task, out in zip(tasks, outputs, strict=True):
            self.assertEqual(task.returncode, 0, out[-3000:])
            self.assertIn("Ran 2 tests", out)


if __name__ == "__main__":
    unittest.main()
