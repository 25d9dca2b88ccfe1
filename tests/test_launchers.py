"""disttest.support.launchers: torchrun, Slurm and Open MPI environments, read and
checked; run_rank under each, simulated with local processes."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import disttest
from disttest.config import ConfigError
from disttest.support import launchers
from disttest.support.launchers import (
    DEFAULT_MASTER_PORT,
    MAX_HOSTS,
    LaunchEnv,
    detect,
    expand_hostlist,
    export,
    first_host,
)

HERE = os.path.dirname(os.path.abspath(__file__))
#: Variables of any launcher, removed from the environment a simulated one gets.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


class HostlistTest(unittest.TestCase):
    def test_forms_scontrol_expands(self):
        cases = {
            "node01": ["node01"],
            "node[01-03,07]": ["node01", "node02", "node03", "node07"],
            "a,b": ["a", "b"],
            "gpu[8-10]": ["gpu8", "gpu9", "gpu10"],
            "n[1-2],m[5],x": ["n1", "n2", "m5", "x"],
            "rack[1-2]-n[01-02]": ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"],
            "host-1.example.org": ["host-1.example.org"],
        }
        for spec, hosts in cases.items():
            with self.subTest(spec=spec):
                self.assertEqual(expand_hostlist(spec), hosts)

    def test_bad_forms_name_the_source(self):
        for spec in ("", "node[01-03", "node[a-b]", "node[3-1]", "node[]", "a,,b", "node]1"):
            with self.subTest(spec=spec), self.assertRaises(ConfigError) as ctx:
                expand_hostlist(spec, "environment variable SLURM_STEP_NODELIST")
            self.assertIn("SLURM_STEP_NODELIST", str(ctx.exception))
            self.assertIn(repr(spec), str(ctx.exception))


class BoundedHostlistTest(unittest.TestCase):
    """A host list is counted before it is expanded, and its first host is
    read without expanding it (a list of a billion hosts once took the
    machine's memory)."""

    HUGE = "n[0-999999999],m[000-999]"

    def test_a_list_longer_than_the_bound_is_refused_not_expanded(self):
        with self.assertRaises(ConfigError) as ctx:
            expand_hostlist(self.HUGE, "environment variable SLURM_JOB_NODELIST")
        self.assertIn(f"it names 1000001000 hosts, more than the {MAX_HOSTS}", str(ctx.exception))
        self.assertIn("SLURM_JOB_NODELIST", str(ctx.exception))
        # At the bound exactly, it is expanded.
        self.assertEqual(len(expand_hostlist(f"n[1-{MAX_HOSTS}]")), MAX_HOSTS)

    def test_the_first_host_without_expanding(self):
        self.assertEqual(first_host(self.HUGE), "n0")
        self.assertEqual(first_host("rack[07-99]-n[001-999],x"), "rack07-n001")
        self.assertEqual(first_host("solo"), "solo")
        with self.assertRaises(ConfigError):
            first_host("a,n[5-")  # the whole list is checked, not only its first host

    def test_detect_reads_a_huge_step_list(self):
        env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": self.HUGE}
        self.assertEqual(detect(env).master_addr, "n0")


class ResolveRankTest(unittest.TestCase):
    """run_rank's rank and world size against the launcher's: a contradiction
    is refused at once, naming both (it once waited 86 s for the store)."""

    SRUN3 = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_STEP_NODELIST": "n[1-3]"}

    def resolve(self, env, *args, **kwargs):
        from unittest import mock

        from disttest.support.launchers import resolve_rank

        with mock.patch.dict(os.environ, env, clear=True):
            return resolve_rank(*args, **kwargs)

    def test_contradictions_name_both_sources(self):
        for args, kwargs, where, value in [
            ((None, 4, False), {}, "run_rank(world_size=...)", "4"),
            ((2, None, False), {}, "run_rank(rank=...)", "2"),
            ((None, None, False), {"declared": 4, "declared_where": "Suite.world_size"}, "Suite.world_size", "4"),
            ((0, 4, True), {}, "run_rank(world_size=...)", "4"),
        ]:
            with self.subTest(args=args, kwargs=kwargs), self.assertRaises(ConfigError) as ctx:
                self.resolve(self.SRUN3, *args, **kwargs)
            message = str(ctx.exception)
            self.assertIn(f"Invalid {'rank' if 'rank=' in where else 'world size'} {value} from {where}", message)
            self.assertIn("the launcher (slurm) gives this process a", message)

    def test_agreement_and_no_launcher(self):
        self.assertEqual(self.resolve(self.SRUN3, None, None, True, declared=3, declared_where="S.world_size"),
                         (1, 3))
        self.assertEqual(self.resolve(self.SRUN3, 1, 3, True), (1, 3))
        # Both given and no launcher: nothing to check against.
        self.assertEqual(self.resolve({}, 0, 4, True), (0, 4))
        with self.assertRaises(ConfigError) as ctx:
            self.resolve({}, None, None, True)
        self.assertEqual(str(ctx.exception), "Invalid launcher environment '' from the environment (disttest): "
                                             + launchers.NO_LAUNCHER)

    def test_run_rank_refuses_bad_arguments_naming_them_and_changes_nothing(self):
        from unittest import mock

        import pool_cases

        cls = pool_cases.Launched
        before = (cls.__dict__.get("rank"), cls.__dict__.get("world_size"))
        for kwargs, message in [
            ({"rank": -1, "world_size": 2}, "Invalid rank -1 from run_rank(rank=...) (disttest): expected an int >= 0"),
            ({"rank": "0", "world_size": 2}, "Invalid rank '0' from run_rank(rank=...)"),
            ({"rank": 5, "world_size": 2}, "Invalid rank 5 from run_rank(rank=...) (disttest): expected 0 <= rank < 2"),
            ({"rank": 0, "world_size": 0}, "Invalid world size 0 from run_rank(world_size=...)"),
        ]:
            with self.subTest(kwargs=kwargs), mock.patch.dict(os.environ, {}, clear=True):
                with self.assertRaises(ConfigError) as ctx:
                    cls.run_rank(**kwargs)
                self.assertIn(message, str(ctx.exception))
                self.assertEqual((cls.__dict__.get("rank"), cls.__dict__.get("world_size")), before)


class DetectTest(unittest.TestCase):
    def test_torchrun(self):
        env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"}
        self.assertEqual(detect(env), LaunchEnv("torchrun", 3, 4, 1, "h0", 1234))

    def test_slurm_master_is_first_host_of_the_step(self):
        env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
               "SLURM_STEP_NODELIST": "node[03-06]", "SLURM_JOB_NODELIST": "node[01-09]", "SLURM_JOB_ID": "77"}
        self.assertEqual(detect(env), LaunchEnv("slurm", 5, 8, 1, "node03", 15077))

    def test_slurm_falls_back_to_the_job_nodelist_and_given_master_wins(self):
        env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "a,b"}
        self.assertEqual(detect(env).master_addr, "a")
        self.assertEqual(detect(env).master_port, DEFAULT_MASTER_PORT)
        self.assertEqual(detect(dict(env, MASTER_ADDR="m", MASTER_PORT="99")).master_addr, "m")
        for bad in ("\u0663\u0660\u0660\u0660\u0660", "2_9500", "0x10", "-1", "70000"):  # (int() read the first two)
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(ConfigError, f"Invalid master port {bad!r} from environment variable "
                                                         "MASTER_PORT"):
                    detect(dict(env, MASTER_PORT=bad))
        given = detect(dict(env, MASTER_ADDR="m"), master_addr="g", master_port=4321)
        self.assertEqual((given.master_addr, given.master_port), ("g", 4321))

    def test_torchrun_inside_srun_wins(self):
        env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]",
               "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_ADDR": "n1", "MASTER_PORT": "29400"}
        self.assertEqual(detect(env), LaunchEnv("torchrun", 3, 4, 3, "n1", 29400))

    def test_openmpi(self):
        env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0"}
        self.assertEqual(detect(env), LaunchEnv("openmpi", 2, 4, 0, "h0", DEFAULT_MASTER_PORT))

    def test_openmpi_on_one_node_needs_no_master(self):
        env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        self.assertEqual(detect(env).master_addr, "127.0.0.1")

    def test_openmpi_on_several_nodes_asks_for_master_addr(self):
        env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        with self.assertRaises(ConfigError) as ctx:
            detect(env)
        self.assertIn("MASTER_ADDR", str(ctx.exception))
        self.assertIn("mpirun -x", str(ctx.exception))

    def test_bad_values_name_the_variable(self):
        cases = [
            ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID", "'x'"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "SLURM_NTASKS", "'0'"),
            ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "a"}, "SLURM_PROCID", "2"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "-1"}, "SLURM_LOCALID", "'-1'"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n[1-"}, "SLURM_STEP_NODELIST",
             "'n[1-'"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "a", "MASTER_PORT": "70000"},
             "MASTER_PORT", "'70000'"),
            ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "two"}, "OMPI_COMM_WORLD_SIZE", "'two'"),
            ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK", "None"),
            ({"RANK": "1.5", "WORLD_SIZE": "2"}, "RANK", "'1.5'"),
            ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "z"}, "LOCAL_RANK", "'z'"),
            ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "5"}, "LOCAL_RANK", "5"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "2", "SLURM_STEP_NODELIST": "a"},
             "SLURM_LOCALID", "2"),
            ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "  "}, "MASTER_ADDR", "'  '"),
            # (int() read "1_0" as 10 and "٣" as 3: a job that waited for ranks that never came)
            ({"RANK": "0", "WORLD_SIZE": "1_0"}, "WORLD_SIZE", "'1_0'"),
            ({"RANK": "٣", "WORLD_SIZE": "4"}, "RANK", "'٣'"),
            ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "a", "MASTER_ADDR": ""},
             "MASTER_ADDR", "''"),
        ]
        for env, variable, value in cases:
            with self.subTest(env=env), self.assertRaises(ConfigError) as ctx:
                detect(env)
            self.assertIn(f"environment variable {variable}", str(ctx.exception))
            self.assertIn(value, str(ctx.exception))

    def test_no_launcher_says_what_to_set(self):
        with self.assertRaises(ConfigError) as ctx:
            detect({"PATH": "/bin"})
        self.assertIn("SLURM_PROCID", str(ctx.exception))
        self.assertIn("OMPI_COMM_WORLD_RANK", str(ctx.exception))

    def test_export_writes_what_env_rendezvous_reads(self):
        env: dict[str, str] = {}
        export(LaunchEnv("slurm", 1, 2, 0, "node01", 15000), env)
        self.assertEqual(env, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                               "MASTER_ADDR": "node01", "MASTER_PORT": "15000"})


def run_simulated(per_rank_env: list[dict[str, str]]) -> list[tuple[int, str]]:
    """Run tests/pool_cases.py (Launched.run_rank() with no arguments) in one
    local process per rank, each with its launcher variables."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "OMPI_"))}
    base["OMP_NUM_THREADS"] = "1"
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "pool_cases.py")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(base, **env))
             for env in per_rank_env]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:  # one that failed must not leave the others waiting
            p.kill()
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]


class RunRankUnderLaunchersTest(unittest.TestCase):
    def check(self, results: list[tuple[int, str]]) -> None:
        for code, out in results:
            self.assertEqual(code, 0, out[-3000:])
            self.assertIn("Ran 3 tests", out)
            self.assertIn("OK", out)

    def test_slurm_two_tasks(self):
        port = str(disttest.find_free_port())
        self.check(run_simulated([
            {"SLURM_PROCID": str(i), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(i),
             "SLURM_STEP_NODELIST": "localhost", "MASTER_PORT": port}
            for i in range(2)
        ]))

    def test_openmpi_three_ranks(self):
        port = str(disttest.find_free_port())
        self.check(run_simulated([
            {"OMPI_COMM_WORLD_RANK": str(i), "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": str(i),
             "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "MASTER_PORT": port}
            for i in range(3)
        ]))

    def test_torchrun_variables(self):
        port = str(disttest.find_free_port())
        self.check(run_simulated([
            {"RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": str(i), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port}
            for i in range(2)
        ]))

    def test_bad_slurm_value_fails_naming_it(self):
        (code, out), = run_simulated([{"SLURM_PROCID": "0", "SLURM_NTASKS": "many"}])
        self.assertNotEqual(code, 0)
        self.assertIn("Invalid world size 'many' from environment variable SLURM_NTASKS (disttest)", out)


if __name__ == "__main__":
    unittest.main()
