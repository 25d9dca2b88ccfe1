"""disttest.bases.checkpoint: upstream's checkpoint_utils names; with_temp_dir
shares one directory between the ranks of every runner and leaves nothing
behind; the test extension reads and writes what upstream's does."""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import unittest
from unittest import mock

import checkpoint_cases as cases
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.testing._internal.distributed import checkpoint_utils as upstream

import disttest.bases.checkpoint as ck
from disttest.pg.fake import with_fake_comms


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


def ok(test: unittest.TestCase, result: unittest.TestResult) -> None:
    problems = [text for _, text in result.failures + result.errors]
    test.assertEqual(problems, [])
    test.assertEqual(result.skipped, [])
    test.assertEqual(result.testsRun, 1)


class NamesTest(unittest.TestCase):
    def test_every_upstream_name(self):
        names = {"Rot13Example", "get_test_extension_registry", "with_temp_dir", "with_checkpoint_logging",
                 "ExtensionRegistry", "StreamTransformExtension"}
        self.assertLessEqual(names, set(ck.__all__))
        for name in ck.__all__:
            self.assertTrue(hasattr(upstream, name), name)
        self.assertIs(ck.ExtensionRegistry, upstream.ExtensionRegistry)
        self.assertIs(ck.StreamTransformExtension, upstream.StreamTransformExtension)


class Rot13Test(unittest.TestCase):
    def test_it_pickles(self):
        # A writer holding one goes to other processes (a process-based async save).
        import pickle

        self.assertIs(pickle.loads(pickle.dumps(ck.Rot13Example)), ck.Rot13Example)
        self.assertIsInstance(pickle.loads(pickle.dumps(ck.Rot13Example())), ck.Rot13Example)

    DATA = bytes(range(256)) * 3 + b"Hello, World 123"

    def written(self, cls):
        out = io.BytesIO()
        stream = cls().transform_to(out)
        stream.write(self.DATA[:100])
        stream.write(memoryview(self.DATA[100:]))
        stream.flush()
        return out.getvalue()

    def test_writes_what_upstream_writes(self):
        ours = self.written(ck.Rot13Example)
        self.assertEqual(ours, self.written(upstream.Rot13Example))
        self.assertNotEqual(ours, self.DATA)
        self.assertTrue(ours.endswith(b"hELLO, wORLD 123"))

    def test_reads_back(self):
        raw = self.written(ck.Rot13Example)
        self.assertEqual(ck.Rot13Example().transform_from(io.BytesIO(raw)).read(), self.DATA)
        self.assertEqual(upstream.Rot13Example().transform_from(io.BytesIO(raw)).read(), self.DATA)

    def test_reads_a_stream_without_readinto(self):
        class ReadOnly:
            def __init__(self, data):
                self.inner = io.BytesIO(data)

            def read(self, n):
                return self.inner.read(n)

        raw = self.written(ck.Rot13Example)
        reader = ck.Rot13Example().transform_from(ReadOnly(raw))
        self.assertEqual(reader.read(), self.DATA)

    def test_seeks(self):
        reader = ck.Rot13Example().transform_from(io.BytesIO(b"abcDEF"))
        self.assertTrue(reader.seekable())
        reader.seek(3)
        self.assertEqual(reader.tell(), 3)
        self.assertEqual(reader.read(), b"def")

    def test_descriptor_and_versions(self):
        ext = ck.Rot13Example()
        self.assertEqual(ext.get_descriptor(), upstream.Rot13Example().get_descriptor())
        self.assertEqual(ext.get_descriptor(), "stream.rot13/1")
        self.assertIsInstance(ck.Rot13Example.from_descriptor("1.4"), ck.Rot13Example)
        with self.assertRaises(ValueError) as caught:
            ck.Rot13Example.from_descriptor("2")
        self.assertEqual(str(caught.exception), ck.UNKNOWN_VERSION.format(version="2", name="stream.rot13"))
        self.assertIn("another version", ck.UNKNOWN_VERSION)  # ("0" was "a newer extension")

    def test_the_byte_helper_is_upstreams(self):
        for data in (b"Hello, World! 123", b"", b"\xff\x00aZ"):
            ours, theirs = bytearray(data), bytearray(data)
            ck.Rot13Example._rot13bytes(ours, len(data) - 1 if data else 0)
            upstream.Rot13Example._rot13bytes(theirs, len(data) - 1 if data else 0)
            self.assertEqual(ours, theirs)

    def test_registry(self):
        registry = ck.get_test_extension_registry()
        self.assertIsInstance(registry, ck.ExtensionRegistry)
        self.assertEqual(set(registry.extensions), set(upstream.get_test_extension_registry().extensions))
        [ext] = registry.from_descriptor_list(["stream.rot13/1"])
        self.assertIsInstance(ext, ck.Rot13Example)
        self.assertIsNot(ck.get_test_extension_registry(), registry)

    @ck.with_temp_dir
    def test_checkpoint_through_the_extension(self):
        model = nn.Linear(4, 3)
        dcp.save({"m": model.state_dict()}, storage_writer=FileSystemWriter(
            self.temp_dir, _extensions=[ck.Rot13Example()]))
        for registry in (ck.get_test_extension_registry(), upstream.get_test_extension_registry()):
            loaded = {"m": nn.Linear(4, 3).state_dict()}
            dcp.load(loaded, storage_reader=FileSystemReader(self.temp_dir, _extension_registry=registry))
            for key, value in model.state_dict().items():
                torch.testing.assert_close(loaded["m"][key], value)
        with self.assertRaisesRegex(CheckpointException, "Unknown extension name='stream.rot13'"):
            dcp.load({"m": nn.Linear(4, 3).state_dict()}, checkpoint_id=self.temp_dir)


class WithTempDirTest(unittest.TestCase):
    """Without a group: a directory of the process's own."""

    def test_made_and_removed(self):
        seen = []

        @ck.with_temp_dir
        def body(self, value):
            seen.append(self.temp_dir)
            self.assertTrue(os.path.isdir(self.temp_dir))
            return value * 2

        self.assertEqual(body(self, 4), 8)
        self.assertEqual(body.__name__, "body")
        self.assertFalse(os.path.exists(seen[0]))

    def test_removed_when_the_body_fails(self):
        seen = []

        @ck.with_temp_dir()
        def body(self):
            seen.append(self.temp_dir)
            with open(os.path.join(self.temp_dir, "f"), "w") as f:
                f.write("x")
            raise KeyError("boom")

        with self.assertRaises(KeyError):
            body(self)
        self.assertFalse(os.path.exists(seen[0]))

    def test_fake_comms_get_a_directory_each(self):
        # Upstream broadcasts over the fake group, where it reaches no peer.
        seen = []

        @with_fake_comms(rank=1, world_size=4)
        @ck.with_temp_dir
        def body(self):
            seen.append(self.temp_dir)
            self.assertTrue(os.path.isdir(self.temp_dir))

        body(self)
        self.assertTrue(seen[0])
        self.assertFalse(os.path.exists(seen[0]))


class WithCheckpointLoggingTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(logging.getLogger("torch.distributed.checkpoint").setLevel,
                        logging.getLogger("torch.distributed.checkpoint").level)
        logging.getLogger("torch.distributed.checkpoint").setLevel(logging.ERROR)

    def levels(self, decorate, name="torch.distributed.checkpoint", fail=False):
        seen = []

        def body(self):
            seen.append(logging.getLogger(name).level)
            if fail:
                raise KeyError("boom")

        try:
            decorate(body)(self)
        except KeyError:
            self.assertTrue(fail)
        return seen + [logging.getLogger(name).level]

    def test_like_upstream(self):
        for module in (ck, upstream):
            self.assertEqual(self.levels(module.with_checkpoint_logging), [logging.INFO, logging.ERROR])
            self.assertEqual(self.levels(module.with_checkpoint_logging, fail=True),
                             [logging.INFO, logging.ERROR])

    def test_arguments(self):
        name = "disttest.test_checkpoint.logger"
        logging.getLogger(name).setLevel(logging.WARNING)
        decorate = ck.with_checkpoint_logging(logger_name=name, level=logging.DEBUG)
        self.assertEqual(self.levels(decorate, name), [logging.DEBUG, logging.WARNING])
        self.assertEqual(logging.getLogger("torch.distributed.checkpoint").level, logging.ERROR)


class RanksTest(unittest.TestCase):
    """One directory for every rank of each runner, gone after the test."""

    def test_dtensor_dcp_roundtrip(self):
        ok(self, run(cases.Checkpoints("test_dcp_roundtrip")))

    def test_dtensor_removed(self):
        ok(self, run(cases.Checkpoints("test_removed")))

    def test_a_rank_that_fails_leaves_the_directory_to_its_peers(self):
        # It removed it at once: rank 1's write raised FileNotFoundError, a
        # second cause, and the test "errored" instead of failing on rank 0.
        result = run(cases.FailsOnRankZero("test_rank_zero_fails"))
        self.assertEqual(len(result.failures), 1, result.errors)
        self.assertEqual(result.errors, [])
        text = result.failures[0][1]
        self.assertIn("rank 0's own failure", text)
        self.assertNotIn("FileNotFoundError", text)

    def test_fake_group(self):
        ok(self, run(cases.FakeRanks("test_own_dir")))

    def test_multiprocess(self):
        ok(self, run(cases.PlainProcesses("test_shared_and_removed")))

    def test_threads(self):
        for name in ("test_shared", "test_removed"):
            ok(self, run(cases.Threads(name)))

    def test_pool(self):
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(cases.Pool).run(result)
        self.assertEqual([text for _, text in result.failures + result.errors], [])
        self.assertEqual(result.testsRun, 2)

    def test_nothing_left_when_the_ranks_die(self):
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        probe = os.path.join(folder, "path")
        with mock.patch.dict(os.environ, {cases.PROBE_ENV: probe}):
            result = run(cases.Crashing("test_crash"))
        self.assertEqual(len(result.failures + result.errors), 1)
        with open(probe) as f:
            made = f.read()
        self.assertTrue(made)
        self.assertFalse(os.path.exists(made))


if __name__ == "__main__":
    unittest.main()
