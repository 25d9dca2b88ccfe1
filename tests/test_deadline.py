"""disttest._runner.deadline: a limit on code in one thread, raised into it
where that leaves no lock held (simulated tests, stopped rank threads)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import unittest

import torch

from disttest._runner.deadline import STOP_SIGNAL, Deadline, DeadlinePassed


def spin(seconds: float | None = None) -> None:
    end = None if seconds is None else time.monotonic() + seconds
    while end is None or time.monotonic() < end:
        pass


def in_logging(seconds: float) -> None:
    """Spin ``seconds`` in a function whose code claims to be logging's."""
    namespace: dict = {"spin": spin}
    path = os.path.join(os.path.dirname(logging.__file__), "handlers.py")
    exec(compile("def emit(seconds):\n    spin(seconds)\n", path, "exec"), namespace)
    namespace["emit"](seconds)


class DeadlineTest(unittest.TestCase):
    def test_raised_into_the_block_with_its_stack(self):
        start = time.monotonic()
        watch = Deadline(0.2)
        with self.assertRaises(DeadlinePassed), watch:
            spin()
        self.assertLess(time.monotonic() - start, 2)
        self.assertEqual([f.name for f in watch.frames][-2:], ["test_raised_into_the_block_with_its_stack", "spin"])

    def test_a_limit_longer_than_a_wait_can_take_is_still_watched(self):
        # DISTTEST_TIMEOUT=1e10 (past threading.TIMEOUT_MAX): the watcher
        # died of an OverflowError in its first wait and the block ran unwatched.
        from unittest import mock

        from disttest._runner import deadline

        raised = []
        self.addCleanup(setattr, threading, "excepthook", threading.excepthook)
        threading.excepthook = lambda args: raised.append(args.exc_value)
        with Deadline(1e10):
            time.sleep(0.1)
        time.sleep(0.1)
        self.assertEqual(raised, [])
        # And it acts when the limit comes, waiting in steps meanwhile.
        with mock.patch.object(deadline, "WAIT_STEP", 0.05), self.assertRaises(DeadlinePassed), Deadline(0.3):
            spin()

    def test_not_while_the_thread_is_in_code_that_takes_locks(self):
        start = time.monotonic()
        with self.assertRaises(DeadlinePassed), Deadline(0.05):
            in_logging(0.5)
            spin()
        self.assertGreaterEqual(time.monotonic() - start, 0.5)

    def test_nothing_lands_after_a_block_that_ended_in_time(self):
        for _ in range(20):
            with Deadline(0.01):
                pass
        spin(0.1)
        self.assertFalse(any(t.name == "disttest-deadline" for t in threading.enumerate()))

    def test_a_blocking_call_of_the_main_thread_is_ended(self):
        # (the signal ends the sleep; a raise from another thread waited for it)
        start = time.monotonic()
        with self.assertRaises(DeadlinePassed) as caught, Deadline(0.2, "the limit passed"):
            time.sleep(30)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(str(caught.exception), "the limit passed")

    def test_raised_again_where_the_block_caught_it(self):
        watch = Deadline(0.1)
        caught = 0
        end = time.monotonic() + 1

        def body():
            nonlocal caught
            while time.monotonic() < end:
                try:
                    spin(0.01)
                except DeadlinePassed:
                    caught += 1

        with watch:
            while True:
                try:
                    body()
                    break
                except DeadlinePassed:  # (it may land on the loop's own bookkeeping)
                    caught += 1
        self.assertTrue(watch.passed)
        self.assertGreaterEqual(caught, 3)

    def test_not_in_the_middle_of_a_change(self):
        from disttest._runner.deadline import mid_change

        namespace: dict = {"sys": sys}
        exec(compile("class CM:\n    def __enter__(self):\n        return sys._getframe()\n", "cm.py", "exec"),
             namespace)
        self.assertTrue(mid_change(namespace["CM"]().__enter__()))
        path = os.path.join(os.path.dirname(torch.__file__), "utils", "_python_dispatch.py")
        exec(compile("def push():\n    return sys._getframe()\n", path, "exec"), namespace)
        self.assertTrue(mid_change(namespace["push"]()))
        self.assertFalse(mid_change(sys._getframe()))

    def test_a_signal_not_its_own_reaches_the_handler_before(self):
        import signal

        seen = []
        before = signal.signal(STOP_SIGNAL, lambda *_: seen.append("before"))
        self.addCleanup(signal.signal, STOP_SIGNAL, before)
        with Deadline(5):
            os.kill(os.getpid(), STOP_SIGNAL)
            spin(0.05)
        self.assertEqual(seen, ["before"])
        self.assertEqual(signal.getsignal(STOP_SIGNAL)(0, None), None)  # put back
        self.assertEqual(seen, ["before", "before"])

    def test_a_block_that_takes_the_signal_for_itself_is_stopped_from_outside(self):
        # Sent after the test set the signal to its default action, it would
        # have ended the whole process.
        import signal

        before = signal.getsignal(STOP_SIGNAL)
        self.addCleanup(signal.signal, STOP_SIGNAL, before)
        with self.assertRaises(DeadlinePassed), Deadline(0.1):
            signal.signal(STOP_SIGNAL, signal.SIG_DFL)
            spin()

    def test_a_suite_s_faulthandler_on_sigusr2_outlives_a_block(self):
        # faulthandler's handler is C's, unseen by signal.getsignal: a block
        # that took SIGUSR2 put back the default action, and the suite's
        # next SIGUSR2 (a CI job asking for stacks) killed the process.
        import subprocess

        code = ("import faulthandler, os, signal, sys\n"
                "from disttest._runner.deadline import Deadline\n"
                "faulthandler.register(signal.SIGUSR2, file=sys.stdout, all_threads=False)\n"
                "with Deadline(5):\n"
                "    pass\n"
                "sys.stdout.flush()\n"
                "os.kill(os.getpid(), signal.SIGUSR2)\n"
                "print('alive', flush=True)\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("most recent call first", proc.stdout)
        self.assertIn("alive", proc.stdout)

    def test_a_thread_not_the_main_one_is_not_stopped_in_a_context_manager_s_exit(self):
        # (stopped from the watcher, as the handler stops the main thread)
        put_back = []
        seen: list[BaseException] = []

        class Mode:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                spin(0.3)
                put_back.append(True)

        def body():
            try:
                with Deadline(0.05):
                    with Mode():
                        pass
                    spin()
            except DeadlinePassed as e:
                seen.append(e)

        thread = threading.Thread(target=body)
        thread.start()
        thread.join(10)
        self.assertFalse(thread.is_alive())
        self.assertEqual(len(seen), 1)
        self.assertEqual(put_back, [True])

    def test_an_exception_of_the_body_is_its_own(self):
        with self.assertRaises(KeyError), Deadline(5):
            raise KeyError("mine")


if __name__ == "__main__":
    unittest.main()


class LingeringTest(unittest.TestCase):
    def test_a_child_forked_while_threads_linger_starts_clean(self):
        # Forked while the watcher held its lock, a child that stopped a
        # thread of its own waited for ever; nor is the log hook its.
        from disttest._runner import deadline

        class Stop(BaseException):
            pass

        stop = threading.Event()

        def blocked():
            try:
                stop.wait(30)
            except Stop:
                pass

        thread = threading.Thread(target=blocked, daemon=True)
        thread.start()
        factory = logging.getLogRecordFactory()
        deadline.stop_when_safe(thread, Stop, lambda: not stop.is_set())
        self.assertIsNot(logging.getLogRecordFactory(), factory)
        with deadline._lingering_lock:  # as the watcher holds it at each look
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the child)
                code = 3 if logging.getLogRecordFactory() is not factory else 0
                deadline.stop_when_safe(threading.current_thread(), Stop, lambda: False)
                os._exit(code)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            self.fail("the child waited for the lock its parent's watcher held")
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, "the child kept the log hook")
        stop.set()
        thread.join(10)
        end = time.monotonic() + 5
        while logging.getLogRecordFactory() is not factory and time.monotonic() < end:
            time.sleep(0.01)
        self.assertIs(logging.getLogRecordFactory(), factory)


class CurrentFramesTest(unittest.TestCase):
    """``sys._current_frames()`` allocates under CPython's lock of its thread
    list; a collection there that frees a tensor releases the GIL, and a
    thread ending (holding the GIL, waiting for that lock) hangs the process.
    It was seen with 1024 rank threads: the stack dump of a test past its
    limit never returned, and SIGTERM could not end the process."""

    def test_no_collection_can_run_while_the_frames_are_read(self):
        import gc
        from unittest import mock

        from disttest._runner import deadline

        seen = []

        def frames():
            seen.append(gc.isenabled())
            return {threading.get_ident(): sys._getframe()}

        with mock.patch.object(deadline.sys, "_current_frames", frames):
            self.assertIn(threading.get_ident(), deadline.current_frames())
            self.assertTrue(gc.isenabled())
            gc.disable()
            try:
                deadline.current_frames()
                self.assertFalse(gc.isenabled())  # left as it was found
            finally:
                gc.enable()
        self.assertEqual(seen, [False, False])

    def test_two_readers_at_once_keep_the_collector_off(self):
        import gc
        from unittest import mock

        from disttest._runner import deadline

        seen = []

        def frames():  # a slow read: the second reader starts during the first
            seen.append(gc.isenabled())
            time.sleep(0.3)
            seen.append(gc.isenabled())
            return {}

        with mock.patch.object(deadline.sys, "_current_frames", frames):
            first = threading.Thread(target=deadline.current_frames)
            first.start()
            time.sleep(0.1)
            deadline.current_frames()
            first.join()
        self.assertTrue(gc.isenabled())
        # Without one reader at a time, the first turned the collector back on
        # under the second one's read.
        self.assertEqual(seen, [False] * 4)

    def test_the_runners_read_frames_only_through_it(self):
        import disttest

        root = os.path.dirname(disttest.__file__)
        callers = []
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        if "sys._current_frames()" in f.read():
                            callers.append(os.path.relpath(path, root))
        self.assertEqual(callers, [os.path.join("_runner", "deadline.py")])
