"""The collective record behind desync reports: wide worlds, all-pairs p2p,
records that do not fit, threads of one rank."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import threading
import time
import unittest
from unittest import mock

from disttest._runner import board as boards
from disttest._runner import join, progress, tracking
from disttest._runner.board import WAITING, MemoryBoard, ProgressBoard
from disttest._runner.progress import find_desync
from disttest._runner.record import Tracker


class RecordEncoderTest(unittest.TestCase):
    """A record is written as json.dumps writes it (the board's reader is
    json.loads), by a faster encoder where the C one is there, else by the
    public one."""

    RECORDS = (
        {"op": "all_reduce", "seq": 3, "group": "0", "peers": [[0, 4]], "counts": {"0": 3, "send>1": 2},
         "state": WAITING, "fr": {"k": [1, 0]}, "fr_at": [1.5, 1e-7], "done_at": 1732640000.123},
        {"op": "recv", "group": "recv<*", "peers": [], "name": "caf\u00e9 \u2603 \"q\"\n", "ok": True, "no": None},
        {},
    )

    def test_the_text_is_json_dumps(self):
        import json

        for record in self.RECORDS:
            with self.subTest(record=record):
                self.assertEqual(boards._encode(record), json.dumps(record, separators=(",", ":")))

    def test_without_the_c_encoder_or_where_it_differs_the_public_one(self):
        import json

        def differs(*args):
            return lambda record, level: ["{}"]  # a scanner whose text is not json.dumps's

        for make in (None, differs):
            with self.subTest(make=make), mock.patch.object(json.encoder, "c_make_encoder", make):
                encode = boards._record_encoder()
            self.assertIsInstance(getattr(encode, "__self__", None), json.JSONEncoder)  # the public encoder
            self.assertEqual(encode(self.RECORDS[0]), json.dumps(self.RECORDS[0], separators=(",", ":")))
        self.assertNotIsInstance(getattr(boards._encode, "__self__", None), json.JSONEncoder)  # the fast one here


class BoardTest(unittest.TestCase):
    def board(self, world_size: int) -> ProgressBoard:
        folder = tempfile.mkdtemp(prefix="disttest-board-")
        self.addCleanup(lambda: (os.remove(os.path.join(folder, "b")), os.rmdir(folder)))
        board = ProgressBoard(os.path.join(folder, "b"), world_size, create=True)
        self.addCleanup(board.close)
        return board

    def test_a_256_rank_collective(self):
        board = self.board(256)
        tracker = Tracker(board, 5)
        tracker.enter("all_reduce", boards.DEFAULT_GROUP, list(range(256)), waits=True)
        flight = board.in_flight(5)
        self.assertEqual(flight.peers, range(256))  # a whole group: O(1) to record and to ask
        self.assertEqual((flight.op, flight.seq), ("all_reduce", 1))
        board.write(200, {"counts": {}, "state": 0})  # rank 200 finished, never entered it
        self.assertEqual(find_desync(board, [5], [200]), [(200, flight)])

    def test_the_polls_questions_decode_no_record(self):
        # The join loop asks at every poll whether a rank waits (a deadlock
        # needs waiting ranks) and, after each pool test, whether any rank
        # made point-to-point calls: from the header and the bytes.
        board = self.board(3)
        board.write(0, {"counts": {"all_reduce": 1}, "op": "all_reduce", "state": boards.WAITING})
        board.write(1, {"counts": {"all_reduce": 1}, "state": boards.IDLE})
        with mock.patch.object(json, "loads", side_effect=AssertionError("decoded")):
            self.assertEqual([board.state(r) for r in range(3)], [boards.WAITING, boards.IDLE, None])
            self.assertEqual([board.names_p2p(r) for r in range(3)], [False, False, False])
            self.assertIsNone(progress.unmatched_p2p(board))
            self.assertEqual(progress.find_deadlocks(board, [1, 2], time.time()), [])
        board.write(1, {"counts": {"send>0": 1}, "state": boards.IDLE})
        board.write(2, {"counts": {}, "op": "recv", "group": "recv<0", "state": boards.WAITING})
        self.assertEqual([board.names_p2p(r) for r in range(3)], [False, True, True])
        self.assertEqual(progress.unmatched_p2p(board), "rank 1 sent rank 0 1 message(s) it did not receive")
        self.assertEqual(MemoryBoard(1).state(0), None)

    def test_a_call_its_arguments_refused_is_not_counted(self):
        # (a test that checks an argument error on one rank: its next call is
        # its peers' next, and the group holds nothing of it)
        board = self.board(2)
        tracker = Tracker(board, 0)
        tracker.enter("scatter", boards.DEFAULT_GROUP, range(2), waits=True)
        tracker.refused([boards.DEFAULT_GROUP])
        self.assertEqual(board.counts(0), {"default": 0})
        tracker.enter("all_reduce", boards.DEFAULT_GROUP, range(2), waits=True)
        self.assertEqual(board.in_flight(0).seq, 1)

    def test_a_desync_check_reads_each_finished_peer_once(self):
        # Issue 26: 1024 thread ranks, half finished and half waiting in the
        # last barrier, made every poll read W x F records.
        world = 1024
        board = MemoryBoard(world)
        for r in range(world):
            tracker = Tracker(board, r)
            tracker.enter("barrier", boards.DEFAULT_GROUP, range(world), waits=r >= 512)
        reads = []
        counts = board.counts
        with mock.patch.object(board, "counts", side_effect=lambda r: reads.append(r) or counts(r)):
            self.assertEqual(find_desync(board, range(512, world), range(512)), [])
        self.assertEqual(sorted(reads), list(range(512)))
        board.write(7, {"counts": {}, "state": 0})  # rank 7 finished without entering it
        found = find_desync(board, range(512, world), range(512))
        self.assertEqual([peer for peer, _ in found], [7] * 512)

    def test_all_pairs_point_to_point_at_64_ranks(self):
        board = self.board(64)
        tracker = Tracker(board, 3)
        for peer in range(64):
            if peer != 3:
                tracker.enter("send", f"send>{peer}", [peer], waits=False)
                tracker.enter("recv", f"recv<{peer}", [peer], waits=False)
        tracker.enter("recv", "recv<7", [7], waits=True)
        self.assertEqual(len(board.counts(3)), 126)
        board.write(7, {"counts": {"send>3": 1}, "state": 0})  # sent one; 3 waits for a second
        found = find_desync(board, [3], [7])
        self.assertEqual([(peer, f.op, f.seq) for peer, f in found], [(7, "recv", 2)])

    def test_a_record_that_does_not_fit_is_kept_whole_without_its_counts(self):
        board = self.board(2)
        counts = {f"group{i}": i for i in range(1000)}  # far more than a slot holds
        board.write(0, {"op": "barrier", "seq": 3, "group": "default", "peers": [[0, 1]],
                        "counts": counts, "state": WAITING})
        self.assertEqual(board.in_flight(0).op, "barrier")
        self.assertIsNone(board.counts(0))  # unknown, not wrong
        board.write(1, {"op": "barrier", "seq": 1, "group": "default", "peers": [[0, 1]],
                        "counts": counts, "state": 0})
        self.assertEqual(find_desync(board, [0], [1]), [])  # no judgement without counts

    def test_a_collective_seen_only_by_the_flight_recorder(self):
        import time

        board = self.board(2)
        now = time.time()

        def waiting(since: float, confirmed: float) -> None:
            board.write(0, {"counts": {}, "state": 0, "fr": {"default": [7, 6, "all_reduce", None]},
                            "fr_at": [since, confirmed]})

        def peer_done(at: float) -> None:
            board.write(1, {"counts": {}, "state": 0, "fr": {"default": [9, 9, "", None]}, "done_at": at})

        waiting(now - 2, now)
        peer_done(now - 1)
        [(peer, flight)] = find_desync(board, [0], [1])
        self.assertEqual((peer, flight.op, flight.seq), (1, "all_reduce", 7))
        self.assertIn("seen by c10d's flight recorder", flight.describe())
        # The recorder's counters are not compared (the peer's 9 >= 7 above):
        # what counts is that the collective stayed pending after the peer ended...
        peer_done(now - 0.1)
        self.assertEqual(find_desync(board, [0], [1]), [])  # ...long enough
        # A record the watcher has not refreshed lately says nothing.
        waiting(now - 5, now - 3)
        peer_done(now - 4)
        self.assertEqual(find_desync(board, [0], [1]), [])

    def test_a_collective_that_raised_is_not_waited_in(self):
        # It stays pending in the recorder (gloo's all_reduce of another size
        # raises on one rank): that rank reports its error; it does not wait.
        import time

        board = self.board(2)
        now = time.time()
        failed = {"op": "all_reduce", "seq": 1, "group": "default", "peers": [[0, 2]], "counts": {"default": 1},
                  "state": boards.FAILED, "fr_at": [now - 2, now]}
        board.write(0, {**failed, "fr": {"default": [1, 0, "all_reduce", None]}})
        self.assertIsNone(board.in_flight(0))
        # A later collective the recorder saw (issued from C++ after the error) is waited in.
        board.write(0, {**failed, "fr": {"default": [2, 1, "all_reduce", None]}})
        self.assertEqual((board.in_flight(0).op, board.in_flight(0).seq), ("all_reduce", 2))

    def test_threads_of_one_rank_count_their_own_depth(self):
        tracker = Tracker(self.board(2), 0)
        tracker.depth += 1
        seen = []
        thread = threading.Thread(target=lambda: seen.append(tracker.depth))
        thread.start()
        thread.join()
        self.assertEqual((tracker.depth, seen), (1, [0]))



class PointToPointTest(unittest.TestCase):
    """Tags in the counts, and ranks that wait for each other in calls that
    cannot match (a deadlock)."""

    def world(self, calls: dict[int, tuple[str, str, int]], at: float = 100.0) -> MemoryBoard:
        board = MemoryBoard(2)
        for rank, (op, group, seq) in calls.items():
            board.write(rank, {"op": op, "seq": seq, "group": group, "peers": [], "counts": {group: seq},
                               "state": WAITING, "at": at})
        return board

    def test_the_key_names_a_tag_other_than_zero(self):
        self.assertEqual(boards.p2p_key("send>", "3", 0), "send>3")
        self.assertEqual(boards.p2p_key("recv<", "*", 7), "recv<*#7")
        self.assertEqual(boards.p2p_key("recv<", "1", None), "recv<1")

    def test_a_send_of_another_tag_leaves_a_finished_peers_receiver_waiting(self):
        board = MemoryBoard(2)
        board.write(0, {"counts": {"send>1#1": 1}, "state": boards.IDLE})
        board.write(1, {"op": "recv", "seq": 1, "group": "recv<0#2", "peers": [[0, 0]], "counts": {"recv<0#2": 1},
                        "state": WAITING})
        [(peer, flight)] = find_desync(board, [1], [0])
        self.assertEqual((peer, flight.describe()), (0, "recv #1 from rank 0 (tag 2)"))
        board.write(0, {"counts": {"send>1#2": 1}, "state": boards.IDLE})  # the same tag: it was sent
        self.assertEqual(find_desync(board, [1], [0]), [])

    def test_calls_that_cannot_match_are_a_deadlock_once_settled(self):
        cases = {
            "tags differ": ({0: ("send", "send>1#1", 1), 1: ("recv", "recv<0#2", 1)}, True),
            "both receive": ({0: ("recv", "recv<1", 1), 1: ("recv", "recv<0", 1)}, True),
            "both send": ({0: ("send", "send>1", 1), 1: ("send", "send>0", 1)}, True),
            "they match": ({0: ("send", "send>1#3", 1), 1: ("recv", "recv<0#3", 1)}, False),
            "from any rank": ({0: ("recv", "recv<*", 1), 1: ("recv", "recv<0", 1)}, False),
            "another peer": ({0: ("recv", "recv<1", 1), 1: ("recv", "recv<2", 1)}, False),
        }
        for name, (calls, deadlock) in cases.items():
            with self.subTest(name):
                board = self.world(calls)
                found = progress.find_deadlocks(board, [0, 1], now=100.0 + progress.P2P_SETTLE)
                self.assertEqual([(p, f.rank) for p, f in found], [(1, 0), (0, 1)] if deadlock else [])
                if deadlock:
                    self.assertEqual(found[0][1].against, board.in_flight(1).describe())
                # Not yet settled: a send may still complete without its receiver.
                self.assertEqual(progress.find_deadlocks(board, [0, 1], now=100.0 + progress.P2P_SETTLE / 2), [])

    def p2p_counts(self, world_size: int, calls) -> dict[int, dict[str, int]]:
        """Each thread rank's point-to-point counts after ``calls(rank)``."""
        import torch.distributed as dist

        from disttest import spawn_threads_and_init_comms

        counts: dict[int, dict[str, int]] = {}

        @spawn_threads_and_init_comms(world_size=world_size)
        def body():
            calls(dist.get_rank())
            counts[dist.get_rank()] = {k: v for k, v in tracking._current().counts.items()
                                       if k.startswith(("send>", "recv<"))}

        body()
        return counts

    def test_calls_are_counted_by_global_peer_and_tag(self):
        import torch
        import torch.distributed as dist

        def calls(rank):
            group = dist.new_group([2, 3])
            if rank == 2:
                dist.send(torch.ones(1), group=group, group_dst=1, tag=5)  # global rank 3
                dist.send(torch.ones(1), dst=3)
            elif rank == 3:
                dist.recv(torch.ones(1), group=group, group_src=0, tag=5)  # global rank 2
                dist.recv(torch.ones(1), src=2)

        counts = self.p2p_counts(4, calls)
        self.assertEqual((counts[2], counts[3]), ({"send>3#5": 1, "send>3": 1}, {"recv<2#5": 1, "recv<2": 1}))

    def test_a_call_the_peer_posted_before_its_wait_matches(self):
        # isend then recv on both ranks (a large exchange waits in recv for
        # longer than the settle time): each has posted the send the other waits for.
        board = self.world({0: ("recv", "recv<1", 1), 1: ("recv", "recv<0", 1)})
        for rank in (0, 1):
            board.read(rank)["counts"][f"send>{1 - rank}"] = 1
        self.assertEqual(progress.find_deadlocks(board, [0, 1], now=100.0 + progress.P2P_SETTLE), [])

    def test_the_sends_of_a_batch_are_counted(self):
        import torch
        import torch.distributed as dist

        def calls(rank):
            op, peer = (dist.isend, 1) if rank == 0 else (dist.irecv, 0)
            for work in dist.batch_isend_irecv([dist.P2POp(op, torch.ones(1), peer),
                                                dist.P2POp(op, torch.ones(1), peer, tag=3)]):
                work.wait()

        counts = self.p2p_counts(2, calls)
        self.assertEqual((counts[0], counts[1]), ({"send>1": 1, "send>1#3": 1}, {"recv<0": 1, "recv<0#3": 1}))

    def waits(self, world_size: int, calls: dict[int, tuple[str, str, int, list[int]]],
              entered: dict[int, dict[str, int]] | None = None) -> list[tuple[int, int]]:
        """(rank, peer) of each rank find_deadlocks reports, the calls
        ``rank: (op, group, seq, peers)`` settled (counts: each rank's own
        call, and ``entered``)."""
        board = MemoryBoard(world_size)
        for rank, (op, group, seq, peers) in calls.items():
            board.write(rank, {"op": op, "seq": seq, "group": group, "peers": boards._runs(peers),
                               "counts": {group: seq, **(entered or {}).get(rank, {})}, "state": WAITING,
                               "at": 100.0})
        self.board = board
        return [(f.rank, p) for p, f in progress.find_deadlocks(board, range(world_size), 100.0 + progress.P2P_SETTLE)]

    def test_a_cycle_of_three_receives_is_a_deadlock(self):
        found = self.waits(3, {0: ("recv", "recv<1", 1, [1]), 1: ("recv", "recv<2", 1, [2]),
                               2: ("recv", "recv<0", 1, [0])})
        self.assertEqual(found, [(0, 1), (1, 2), (2, 0)])
        [(_, flight)] = progress.find_deadlocks(self.board, [0, 1, 2], 100.0 + progress.P2P_SETTLE)[:1]
        self.assertEqual(flight.cycle, ((0, "recv #1 from rank 1"), (1, "recv #1 from rank 2"),
                                        (2, "recv #1 from rank 0")))
        self.assertEqual(join._desync_detail((1, flight), 3),
                         "ranks 0, 1, 2/3 wait for each other in calls that cannot match: rank 0/3 in recv #1 from "
                         "rank 1, rank 1/3 in recv #1 from rank 2, rank 2/3 in recv #1 from rank 0")
        # One of them sent first (an isend before its wait): the cycle is open.
        self.board.read(1)["counts"]["send>0"] = 1
        self.assertEqual(progress.find_deadlocks(self.board, [0, 1, 2], 100.0 + progress.P2P_SETTLE), [])

    def test_a_receive_from_a_rank_in_a_collective_it_never_reaches_is_a_deadlock(self):
        # 0 waits for 1's send; 1 waits in a barrier 0 never entered; 2 waits
        # in the same barrier, entered: it waits for 0, but no one waits for it.
        calls = {0: ("recv", "recv<1", 1, [1]), 1: ("barrier", "default", 1, [0, 1, 2]),
                 2: ("barrier", "default", 1, [0, 1, 2])}
        self.assertEqual(self.waits(3, calls), [(0, 1), (1, 0)])
        detail = join._desync_detail(progress.find_deadlocks(self.board, [0, 1, 2], 100.0 + progress.P2P_SETTLE)[0], 3)
        self.assertEqual(detail, "ranks 0, 1/3 wait for each other in calls that cannot match: rank 0/3 in recv #1 "
                                 "from rank 1, rank 1/3 in barrier #1 of the default group")
        # Rank 0 had entered the barrier (an async one): rank 1 does not wait for it.
        self.assertEqual(self.waits(3, calls, entered={0: {"default": 1}}), [])
        # Rank 1 had posted the send before the barrier: rank 0's receive completes.
        self.assertEqual(self.waits(3, calls, entered={1: {"send>0": 1}}), [])

    def test_collectives_of_two_groups_each_waiting_for_the_other_are_a_deadlock(self):
        calls = {0: ("all_reduce", "1", 1, [0, 1]), 1: ("broadcast", "2", 1, [0, 1])}
        self.assertEqual(self.waits(2, calls), [(0, 1), (1, 0)])
        # The same group in the same order: one collective, nobody missing.
        self.assertEqual(self.waits(2, {0: ("all_reduce", "1", 1, [0, 1]), 1: ("all_reduce", "1", 1, [0, 1])}), [])

    def test_ranks_in_one_collective_as_different_calls_are_a_deadlock(self):
        calls = {0: ("all_reduce", "default", 1, [0, 1]), 1: ("broadcast", "default", 1, [0, 1])}
        self.assertEqual(self.waits(2, calls), [(0, 1), (1, 0)])
        detail = join._desync_detail(progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE)[0], 2)
        self.assertEqual(detail, "ranks 0, 1/2 wait for each other in calls that cannot match: rank 0/2 in "
                                 "all_reduce #1 of the default group, rank 1/2 in broadcast #1 of the default group")
        # Not the root: it waits for the root, which waits in another call.
        self.board.read(1)["root"] = 0
        self.assertEqual(len(progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE)), 2)
        # Two names of one collective match.
        self.assertEqual(self.waits(2, {0: ("_all_gather_base", "default", 1, [0, 1]),
                                        1: ("all_gather_into_tensor", "default", 1, [0, 1])}), [])
        # Different collectives of different numbers are not a mismatch by themselves.
        self.assertEqual(self.waits(2, {0: ("all_reduce", "default", 2, [0, 1]),
                                        1: ("broadcast", "default", 1, [0, 1])}, entered={1: {"default": 2}}), [])

    def test_ranks_in_one_broadcast_from_different_roots_are_a_deadlock(self):
        calls = {0: ("broadcast", "default", 1, [0, 1]), 1: ("broadcast", "default", 1, [0, 1])}
        self.waits(2, calls)
        for rank in (0, 1):
            self.board.read(rank)["root"] = rank  # each its own root
        found = progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE)
        self.assertEqual([(f.rank, p) for p, f in found], [(0, 1), (1, 0)])
        self.assertEqual(found[0][1].cycle, ((0, "broadcast #1 of the default group from rank 0"),
                                             (1, "broadcast #1 of the default group from rank 1")))
        self.board.read(1)["root"] = 0  # the same root: one broadcast
        self.assertEqual(progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE), [])

    def test_receives_from_any_rank_deadlock_once_no_rank_can_send(self):
        # Two ranks, both receiving from any rank: nobody sends.
        self.assertEqual(self.waits(2, {0: ("recv", "recv<*", 1, [0, 1]), 1: ("recv", "recv<*", 1, [0, 1])}),
                         [(0, 1), (1, 0)])
        detail = join._desync_detail(progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE)[0], 2)
        self.assertEqual(detail, "ranks 0, 1/2 wait for each other in calls that cannot match: ranks 0, 1/2 in "
                                 "recv #1 from any rank")
        # A message is on its way (rank 1 sent before it waited): rank 0's receive takes it.
        self.assertEqual(self.waits(2, {0: ("recv", "recv<*", 1, [0, 1]), 1: ("recv", "recv<*", 1, [0, 1])},
                                    entered={1: {"send>0": 1}}), [])
        # Three ranks: 0 receives from any, 1 from 0, 2 waits in a barrier with 0 and 1.
        calls = {0: ("recv", "recv<*", 1, [0, 1, 2]), 1: ("recv", "recv<0", 1, [0]),
                 2: ("barrier", "default", 1, [0, 1, 2])}
        self.assertEqual(self.waits(3, calls), [(0, 1), (1, 0), (2, 0)])
        # A rank of the group that computes may still send.
        del calls[2]
        self.assertEqual(self.waits(3, calls), [])
        # One that sends to it: the receive completes.
        calls[2] = ("send", "send>0", 1, [0])
        self.assertEqual(self.waits(3, calls), [])

    def test_a_receive_from_any_rank_needs_every_sender_blocked(self):
        # 0 receives from any of 0-2, 1 from 0; 2 waits in a barrier of a
        # group with 3, which computes: 2 may go on, then send to 0.
        calls = {0: ("recv", "recv<*", 1, [0, 1, 2]), 1: ("recv", "recv<0", 1, [0]),
                 2: ("barrier", "2", 1, [2, 3])}
        self.assertEqual(self.waits(4, calls), [])
        # Once 3 waits in a receive from 2 as well, nobody can go on.
        calls[3] = ("recv", "recv<2", 1, [2])
        self.assertEqual([r for r, _ in self.waits(4, calls)], [0, 1, 2, 3])

    def test_a_rank_of_the_cycle_that_has_not_settled_is_waited_for(self):
        # 1 and 2 wait for each other (a cycle of their own); 0, which waits
        # for 1 and which 2's barrier waits for, came a moment later.
        calls = {0: ("recv", "recv<1", 1, [1]), 1: ("recv", "recv<2", 1, [2]), 2: ("barrier", "default", 1, [0, 1, 2])}
        self.waits(3, calls)
        self.board.read(0)["at"] = 101.0
        now = 100.0 + progress.P2P_SETTLE
        self.assertEqual(progress.find_deadlocks(self.board, [0, 1, 2], now), [])
        found = progress.find_deadlocks(self.board, [0, 1, 2], now + 1.0)
        self.assertEqual([f.rank for _, f in found], [0, 1, 2])
        # A rank that waits outside the cycle does not hold its report back.
        self.board.read(0)["group"], self.board.read(0)["peers"] = "recv<2", [[2, 2]]
        self.board.read(2)["peers"] = [[1, 2]]
        self.assertEqual([f.rank for _, f in progress.find_deadlocks(self.board, [0, 1, 2], now)], [1, 2])

    def test_only_settled_waits_make_a_cycle(self):
        board = MemoryBoard(2)
        board.write(0, {"op": "recv", "seq": 1, "group": "recv<1", "peers": [[1, 1]], "counts": {"recv<1": 1},
                        "state": WAITING, "at": 100.0})
        board.write(1, {"op": "barrier", "seq": 1, "group": "default", "peers": [[0, 1]], "counts": {"default": 1},
                        "state": WAITING, "at": 100.0 + progress.P2P_SETTLE / 2})
        self.assertEqual(progress.find_deadlocks(board, [0, 1], 100.0 + progress.P2P_SETTLE), [])
        board.read(1)["state"] = boards.IDLE  # a rank that computes waits for no one
        self.assertEqual(progress.find_deadlocks(board, [0, 1], 100.0 + 2 * progress.P2P_SETTLE), [])

    def test_a_rank_in_a_broadcast_that_is_not_its_root_waits_for_the_root_only(self):
        # 1 waits for 2's send; 2 waits in a broadcast from 0 (it computes),
        # which 1 has not entered: with gloo 2 needs 0's data only.
        calls = {1: ("recv", "recv<2", 1, [2]), 2: ("broadcast", "default", 1, [0, 1, 2])}
        self.assertEqual(self.waits(3, calls), [(1, 2), (2, 1)])  # (without the root: any member)
        self.board.read(2)["root"] = 0
        self.assertEqual(progress.find_deadlocks(self.board, [1, 2], 100.0 + progress.P2P_SETTLE), [])
        # The root itself waits for every member.
        calls = {0: ("broadcast", "default", 1, [0, 1]), 1: ("recv", "recv<0", 1, [0])}
        self.assertEqual(self.waits(2, calls), [(0, 1), (1, 0)])
        self.board.read(0)["root"] = 0
        self.assertEqual(len(progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE)), 2)

    def test_a_deadlock_says_when_its_first_call_raises_by_itself(self):
        self.waits(2, {0: ("recv", "recv<1", 1, [1]), 1: ("recv", "recv<0", 1, [0])})
        self.board.read(0)["limit"] = 8.0
        self.board.read(1)["limit"] = 1800.0
        found = progress.find_deadlocks(self.board, [0, 1], 100.0 + progress.P2P_SETTLE)
        self.assertEqual([f.ends for _, f in found], [108.0, 108.0])

    def test_a_blocking_call_records_its_groups_timeout_and_a_broadcasts_root(self):

        import torch
        import torch.distributed as dist

        from disttest import spawn_threads_and_init_comms

        records = {}

        @spawn_threads_and_init_comms(world_size=4)
        def body():
            group = dist.new_group([2, 3], timeout=datetime.timedelta(seconds=8))
            if dist.get_rank() >= 2:
                dist.broadcast(torch.ones(1), group=group, group_src=1)  # global rank 3
                records[dist.get_rank()] = dict(tracking._current().record)
            dist.broadcast(torch.ones(1), src=1, async_op=True).wait()
            records[-dist.get_rank() - 1] = dict(tracking._current().record)

        body()
        self.assertEqual(records[2]["limit"], 8.0)
        # The threaded group's broadcast waits for every rank: no root to wait for only.
        self.assertNotIn("root", records[2])
        # The wait on an asynchronous call's request is a wait in the call.
        self.assertEqual((records[-1]["op"], records[-1]["seq"], records[-1]["state"]), ("broadcast", 1, boards.IDLE))
        self.assertIn("limit", records[-1])
        # A process rank's (gloo's) records it, as a global rank.
        board = MemoryBoard(4)
        tracker = Tracker(board, 2)
        with mock.patch.object(tracking, "_current", return_value=tracker), \
                mock.patch("torch.distributed.is_initialized", return_value=True), \
                mock.patch("torch.distributed.get_global_rank", return_value=3), \
                mock.patch("torch.distributed.get_process_group_ranks", return_value=[2, 3]), \
                mock.patch("torch.distributed.get_world_size", return_value=4), \
                mock.patch.object(tracker, "limit", return_value=9.0):
            tracked = tracking._wrap(dist, "broadcast", lambda tensor, src=None, group=None, async_op=False,
                                     group_src=None: None)
            tracked(torch.ones(1), group=object(), group_src=1)
            self.assertEqual((board.read(2)["root"], board.read(2)["limit"]), (3, 9.0))
            monitored = tracking._wrap(dist, "monitored_barrier", lambda group=None, timeout=None,
                                       wait_all_ranks=False: None)
            monitored(timeout=datetime.timedelta(seconds=4))
            self.assertEqual((board.read(2)["op"], board.read(2)["limit"]), ("monitored_barrier", 4.0))

    def test_a_wait_on_a_request_is_recorded_as_waiting_in_its_call(self):
        import torch.distributed as dist

        class Work:  # (what a batch returns: one per operation)
            pass

        tracker = Tracker(MemoryBoard(4), 2)
        keys = ["send>3", "recv<1#5", "send>3"]
        tracker.enter("batch_isend_irecv", boards.P2P_GROUP, [], False, keys)
        works = [Work(), Work(), Work()]
        ops = [mock.Mock(group=None), mock.Mock(group=None), mock.Mock(group=None)]
        with mock.patch.object(tracker, "limit", return_value=None):
            tracking._remember(dist, tracker, "batch_isend_irecv", {}, works, None, keys, (ops,), {})
        self.assertEqual(tracker.pending[works[1]], {"op": "irecv", "seq": 1, "group": "recv<1#5",
                                                     "peers": [[1, 1]], "limit": None})
        # Two sends to one peer: the first is send #1, the second send #2.
        self.assertEqual([tracker.pending[works[i]]["seq"] for i in (0, 2)], [1, 2])
        waited = tracking._waiting(lambda work, timeout=None: dict(tracker.board.read(2)))
        with mock.patch.object(tracking, "_current", return_value=tracker):
            during = waited(works[1])
            self.assertEqual((during["op"], during["group"], during["state"]), ("irecv", "recv<1#5", WAITING))
            self.assertIsNone(during["limit"])
            self.assertEqual(tracker.board.read(2)["state"], boards.IDLE)  # after the wait
            self.assertNotIn(works[1], tracker.pending)  # (waited once)
            self.assertEqual(waited(works[0], datetime.timedelta(seconds=3))["limit"], 3.0)
            before = dict(tracker.board.read(2))
            self.assertEqual(waited(object()), before)  # a Work of no call: nothing recorded

    def test_a_wait_in_another_thread_of_the_rank_makes_no_cycle(self):
        # A communication thread waits on an irecv while the rank's own thread
        # computes and then sends: the rank may still act.
        tracker = Tracker(MemoryBoard(2), 0)
        tracker.enter("irecv", "recv<1", [1], False)
        call = {k: tracker.record[k] for k in ("op", "seq", "group", "peers")}
        helper = threading.Thread(target=tracker.wait_in, args=(call, None))
        helper.start()
        helper.join()
        board = tracker.board
        self.assertTrue(board.read(0)["aside"])
        board.write(1, {"op": "recv", "seq": 1, "group": "recv<0", "peers": [[0, 0]], "counts": {"recv<0": 1},
                        "state": WAITING, "at": board.read(0)["at"]})
        later = board.read(0)["at"] + progress.P2P_SETTLE
        self.assertEqual(progress.find_deadlocks(board, [0, 1], later), [])
        tracker.wait_in(call, None)  # the rank's own thread: a cycle
        self.assertNotIn("aside", board.read(0))
        self.assertEqual(len(progress.find_deadlocks(board, [0, 1], board.read(0)["at"] + progress.P2P_SETTLE)), 2)

    def test_a_python_work_whose_wait_reaches_c10ds_keeps_working_under_tracking(self):
        # pybind takes a wait found on the class for a Python subclass's override.
        import torch.distributed as dist

        class Plain(dist.distributed_c10d.Work):
            pass

        class Calls(dist.distributed_c10d.Work):
            def wait(self, timeout=datetime.timedelta(0)):
                return super().wait(timeout)

        undo = tracking.install_tracking()
        try:
            for work in (Plain(), Calls()):
                with self.assertRaisesRegex(RuntimeError, "timed out"):
                    work.wait(datetime.timedelta(milliseconds=10))
        finally:
            undo()

    def test_a_users_own_patch_of_work_wait_survives_tracking(self):
        import torch.distributed as dist

        work = dist.distributed_c10d.Work
        tracking.install_tracking()()  # (a first install: what it walks is kept)
        torchs = vars(work)["wait"]

        def spy(self, *args, **kwargs):
            return torchs(self, *args, **kwargs)

        work.wait = spy
        try:
            undo = tracking.install_tracking()
            self.assertIsNot(vars(work)["wait"], spy)
            undo()
            self.assertIs(vars(work)["wait"], spy)
        finally:
            work.wait = torchs

    def test_every_wait_of_a_work_class_is_wrapped_while_tracking_is_installed(self):
        import torch.distributed as dist

        work = dist.distributed_c10d.Work
        before = vars(work)["wait"]
        undo = tracking.install_tracking()
        try:
            self.assertTrue(getattr(vars(work)["wait"], "__disttest_tracked__", False))
        finally:
            undo()
        self.assertIs(vars(work)["wait"], before)

    def test_a_thousand_ranks_in_a_collective_leave_the_cycle_to_the_two_in_it(self):
        world = 1024
        calls = {r: ("all_reduce", "default", 3, list(range(world))) for r in range(1, world)}
        calls[0] = ("recv", "recv<1", 1, [1])
        self.assertEqual(self.waits(world, calls, entered={0: {"default": 2}}), [(0, 1), (1, 0)])

    def test_a_peer_that_is_not_a_number_is_never_judged(self):
        board = self.world({0: ("recv", "recv<x", 1), 1: ("recv", "recv<0", 1)})
        self.assertEqual(progress.find_deadlocks(board, [0, 1], now=100.0 + progress.P2P_SETTLE), [])
        self.assertEqual(find_desync(board, [0], [1]), [])

    def test_a_peer_whose_counts_overflowed_is_never_judged(self):
        board = self.world({0: ("recv", "recv<1", 1), 1: ("recv", "recv<0", 1)})
        board.read(1)["overflow"] = True
        # Rank 1 may have posted an isend to rank 0 before its wait: then rank 0
        # goes on and may yet send to rank 1. Neither is judged.
        self.assertEqual(progress.find_deadlocks(board, [0, 1], now=100.0 + progress.P2P_SETTLE), [])
        del board.read(1)["overflow"]
        self.assertEqual(len(progress.find_deadlocks(board, [0, 1], now=100.0 + progress.P2P_SETTLE)), 2)


if __name__ == "__main__":
    unittest.main()


class UnmatchedCollectivesTest(unittest.TestCase):
    """What a pool's parent reads after each test: the groups whose ranks
    entered different numbers of collectives (the next test's would match
    the leftover)."""

    def left(self, *counts):
        return progress.unmatched_collectives(UnmatchedPointToPointTest.Board(list(counts)))

    def test_equal_counts_leave_nothing(self):
        self.assertIsNone(self.left({"default": 2}, {"default": 2}))
        # Not collectives: point-to-point calls, the rendezvous, the flight recorder's counts.
        self.assertIsNone(self.left({"default": 1, "send>1": 3, "rendezvous": 1, "p2p": 2, "fr:default": 5},
                                    {"default": 1, "recv<0": 1, "fr:default": 4}))
        # A group's members are the ranks that entered its collectives.
        self.assertIsNone(self.left({"default": 1, "g1": 2}, {"default": 1}, {"default": 1, "g1": 2}))
        self.assertIsNone(self.left({"default": 1}, None))  # a count unknown decides nothing

    def test_what_is_left_is_named(self):
        # Every rank is a member of the default group: one that entered none counts 0.
        self.assertEqual(self.left({"default": 1}, {}, {"default": 1}),
                         "in the default group ranks 0, 2 entered 1 collective(s), rank 1 entered 0")
        self.assertEqual(self.left({"default": 1, "7": 3}, {"default": 1, "7": 2}),
                         "in group 7 rank 0 entered 3 collective(s), rank 1 entered 2")


class UnmatchedPointToPointTest(unittest.TestCase):
    """What a pool's parent reads after each test: the point-to-point calls
    of the ranks that nothing matched (they would match the next test's)."""

    class Board(boards._Reads):
        def __init__(self, counts):
            self.c = counts
            self.world_size = len(counts)

        def read(self, rank):  # (None: the counts overflowed the rank's slot)
            return {"overflow": True} if self.c[rank] is None else {"counts": self.c[rank]}

    def left(self, *counts):
        from disttest._runner.progress import unmatched_p2p

        return unmatched_p2p(self.Board(list(counts)))

    def test_matched_calls_leave_nothing(self):
        self.assertIsNone(self.left({"send>1": 2, "recv<1#7": 1}, {"recv<0": 2, "send>0#7": 1}))
        # Receives from any rank take whatever the senders sent.
        self.assertIsNone(self.left({"send>2": 2}, {"send>2": 1}, {"recv<0": 1, "recv<*": 2}))
        self.assertIsNone(self.left({"send>1": 1, "all_reduce": 3}, {"recv<*": 1, "all_reduce": 3}))
        # A count that is unknown decides nothing.
        self.assertIsNone(self.left({"send>1": 1}, None))

    def test_what_is_left_is_named(self):
        self.assertEqual(self.left({"send>1": 1}, {}), "rank 0 sent rank 1 1 message(s) it did not receive")
        self.assertEqual(self.left({}, {"recv<0#7": 2}),
                         "rank 1 posted 2 receive(s) from rank 0 (tag 7) it did not send")
        # Any-source receives take one message each, whoever sent it: one
        # receive for two senders' messages leaves one (it counted once per sender).
        self.assertEqual(self.left({"send>2": 1}, {"send>2": 1}, {"recv<*": 1}),
                         "ranks 0, 1 sent rank 2 1 message(s) it did not receive")
        self.assertEqual(self.left({"send>2": 2}, {"send>2": 1}, {"recv<0": 1, "recv<*": 1}),
                         "ranks 0, 1 sent rank 2 1 message(s) it did not receive")
        self.assertEqual(self.left({"send>1": 1}, {"recv<*": 3}),
                         "rank 1 posted 2 receive(s) from any rank that no rank sent")
        # Tags match only their own.
        self.assertEqual(self.left({"send>1#3": 1}, {"recv<0": 1}),
                         "rank 1 posted 1 receive(s) from rank 0 it did not send; "
                         "rank 0 sent rank 1 1 message(s) (tag 3) it did not receive")
