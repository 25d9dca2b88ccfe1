"""The rank channel: the parent's one decoder of what ranks say."""

from __future__ import annotations

import time
import unittest
from unittest import mock

from disttest._runner.channel import Channel, connect
from disttest._runner.messages import Done, Hello, Leave, Ready, Run, Start, deliver, send
from disttest._runner.outcome import Kind, Outcome


def pump_until(channel: Channel, done, rounds: int = 100) -> None:
    for _ in range(rounds):
        if done():
            return
        channel.pump(0.05)
    raise AssertionError("the channel never got there")


class ChannelTest(unittest.TestCase):
    def setUp(self):
        self.channel = Channel(2)
        self.addCleanup(self.channel.close)

    def rank(self, rank: int, token: str | None = None):
        conn = connect(self.channel.address)
        self.addCleanup(conn.close)
        conn.send(Hello(rank, self.channel.token if token is None else token))
        return conn

    def test_ranks_are_taken_in_and_ready(self):
        a, b = self.rank(0), self.rank(1)
        a.send(Ready(0))
        b.send(Ready(1, Outcome(1, Kind.SKIPPED, message="no gloo")))
        pump_until(self.channel, lambda: len(self.channel.ready) == 2)
        self.assertIsNone(self.channel.ready[0])
        self.assertEqual(self.channel.ready[1].skip_reason, "no gloo")
        # Everyone is here: the endpoint is closed, nobody else can connect.
        self.assertIsNone(self.channel.endpoint)
        with self.assertRaises(OSError):
            connect(self.channel.address)

    def test_a_wrong_token_or_rank_is_not_a_rank(self):
        stranger = self.rank(0, token="guess")
        out_of_range = self.rank(7)
        pump_until(self.channel, lambda: stranger.poll(0) and out_of_range.poll(0))
        for conn in (stranger, out_of_range):
            with self.assertRaises(EOFError):
                conn.recv()  # closed by the parent
        self.assertEqual(self.channel.conns, {})

    def test_a_first_message_that_is_not_hello_is_dropped(self):
        conn = connect(self.channel.address)
        self.addCleanup(conn.close)
        conn.send(Ready(0))
        pump_until(self.channel, lambda: conn.poll(0))
        with self.assertRaises(EOFError):
            conn.recv()
        self.assertEqual(self.channel.ready, {})

    def test_a_second_hello_for_a_rank_is_dropped(self):
        first = self.rank(0)
        pump_until(self.channel, lambda: 0 in self.channel.conns)
        second = self.rank(0)
        pump_until(self.channel, lambda: second.poll(0))
        with self.assertRaises(EOFError):
            second.recv()
        self.assertEqual(self.channel.conns[0].fileno() >= 0, True)
        first.send(Ready(0))
        pump_until(self.channel, lambda: 0 in self.channel.ready)

    def test_answers_to_an_older_test_are_dropped(self):
        a = self.rank(0)
        a.send(Ready(0))
        pump_until(self.channel, lambda: 0 in self.channel.ready)
        old = self.channel.dispatch("test_a")
        self.assertEqual(a.recv(), Run(old, "test_a"))
        new = self.channel.dispatch("test_b")
        self.assertEqual(a.recv(), Run(new, "test_b"))
        a.send(Done(old, Outcome(0, Kind.FAILED, "AssertionError", "stale")))
        a.send(Done(new, Outcome(0, Kind.PASSED)))
        pump_until(self.channel, lambda: 0 in self.channel.answers)
        self.assertEqual(self.channel.answers[0].kind, Kind.PASSED)

    def test_a_rank_cannot_answer_for_another(self):
        a = self.rank(0)
        self.rank(1)
        a.send(Ready(0))
        pump_until(self.channel, lambda: 0 in self.channel.ready and 1 in self.channel.conns)
        seq = self.channel.dispatch("t")
        a.send(Done(seq, Outcome(1, Kind.PASSED)))  # rank 0 posing as rank 1
        a.send(Done(seq, Outcome(0, Kind.PASSED)))
        pump_until(self.channel, lambda: 0 in self.channel.answers)
        self.assertNotIn(1, self.channel.answers)

    def test_a_fresh_process_run_sends_no_run_and_takes_test_1(self):
        # Its ranks start their one test unasked: a Run would also end their
        # wait for Leave at once.
        channel = Channel(1, first_test="test_x")
        self.addCleanup(channel.close)
        conn = connect(channel.address)
        self.addCleanup(conn.close)
        conn.send(Hello(0, channel.token))
        conn.send(Ready(0))
        pump_until(channel, lambda: 0 in channel.ready)
        self.assertFalse(conn.poll(0.2))
        conn.send(Done(1, Outcome(0, Kind.PASSED)))
        pump_until(channel, lambda: 0 in channel.answers)
        self.assertIs(channel.answers[0].kind, Kind.PASSED)

    def test_the_kept_poll_set_follows_the_objects_waited_on(self):
        # Registered once, not per wait; an object no longer waited on (or
        # closed, its descriptor number reused by another) is never reported.
        import multiprocessing

        from disttest._runner.channel import _Poller

        poller = _Poller()
        r1, w1 = multiprocessing.Pipe(duplex=False)
        with mock.patch.object(poller._selector, "register", wraps=poller._selector.register) as register:
            self.assertEqual(poller.wait([r1], 0), [])
            w1.send("x")
            self.assertEqual(poller.wait([r1], 0), [r1])
            self.assertEqual(poller.wait([r1], 0), [r1])
        self.assertEqual(register.call_count, 1)
        self.assertEqual(poller.wait([], 0), [])  # ready, but not asked about
        fd = r1.fileno()
        r1.close()
        w1.close()
        r2, w2 = multiprocessing.Pipe(duplex=False)
        self.addCleanup(r2.close)
        self.addCleanup(w2.close)
        self.assertEqual(poller.wait([r1, r2], 0), [])  # the closed one is skipped
        w2.send("y")
        ready = poller.wait([r2], 5)
        self.assertEqual(ready, [r2], (fd, r2.fileno()))
        self.assertEqual(r2.recv(), "y")
        poller.clear()
        self.assertEqual(poller.wait([], 0), [])

    def test_garbage_closes_that_connection_only(self):
        a, b = self.rank(0), self.rank(1)
        pump_until(self.channel, lambda: len(self.channel.conns) == 2)
        a.send_bytes(b"not a pickle")
        self.channel.pump(0.5)
        self.assertTrue(self.channel.conns[0].closed)
        b.send(Ready(1))
        pump_until(self.channel, lambda: 1 in self.channel.ready)
        self.assertFalse(self.channel.conns[1].closed)

    def test_half_a_message_does_not_stall_the_parent(self):
        import socket

        from disttest._runner import channel as channel_mod

        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(stranger.close)
        with mock.patch.object(channel_mod, "FRAME_TIMEOUT", 0.2):
            stranger.connect(self.channel.address)
            stranger.sendall(b"\x00\x00\x01\x00")  # a header announcing 256 bytes, then nothing
            start = time.monotonic()
            self.channel.pump(0.5)
            self.channel.pump(0.5)
        self.assertLess(time.monotonic() - start, 3)
        self.assertEqual(self.channel._pending, [])  # dropped

    def test_a_forked_rank_does_not_keep_the_endpoint_open(self):
        import os
        import signal

        for drop in (True, False):
            with self.subTest(drop=drop):
                channel = Channel(1)
                self.addCleanup(channel.close)
                ready_r, ready_w = os.pipe()
                pid = os.fork()
                if pid == 0:  # a rank forked from the test process
                    if drop:
                        channel.drop_inherited()
                    os.write(ready_w, b"x")
                    time.sleep(30)
                    os._exit(0)
                self.addCleanup(lambda pid=pid: (os.kill(pid, signal.SIGKILL), os.waitpid(pid, 0)))
                os.read(ready_r, 1)
                os.close(ready_r)
                os.close(ready_w)
                channel.endpoint.close()
                if drop:
                    with self.assertRaises(OSError):
                        connect(channel.address)
                else:  # what drop_inherited prevents
                    connect(channel.address).close()

    def test_nothing_to_wait_on_waits_instead_of_spinning(self):
        self.channel.close()
        start = time.monotonic()
        self.channel.pump(0.2)
        self.assertGreaterEqual(time.monotonic() - start, 0.15)


class DeliverTest(unittest.TestCase):
    def test_calls_the_handler_of_the_message_type(self):
        seen = []

        class Handler:
            def on_leave(self, message, extra):
                seen.append((message, extra))

        self.assertTrue(deliver(Leave(), Handler(), "x"))
        self.assertEqual(seen, [(Leave(), "x")])

    def test_unknown_or_unhandled_messages_are_dropped(self):
        class Handler:
            pass

        self.assertFalse(deliver(Start(1, None), Handler()))
        self.assertFalse(deliver(("done", 1, None), Handler()))
        self.assertFalse(deliver("run", Handler()))


class SendTest(unittest.TestCase):
    def test_a_message_sent_plainly_is_what_recv_reads(self):
        # A plain pickle in conn.send's frame: conn.send's pickler copies its
        # dispatch table for every message.
        from multiprocessing import Pipe
        from multiprocessing.reduction import ForkingPickler

        a, b = Pipe()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        done = Done(3, Outcome(1, Kind.FAILED, message="boom"))
        with mock.patch.object(ForkingPickler, "dumps", side_effect=AssertionError("conn.send's pickler")):
            send(a, done)
            send(a, Run(4, "test_x"))
        self.assertEqual(b.recv(), done)
        self.assertEqual(b.recv(), Run(4, "test_x"))


if __name__ == "__main__":
    unittest.main()
