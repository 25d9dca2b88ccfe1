"""Ports, connect retries and TCP stores bind to loopback."""

from __future__ import annotations

import socket
import unittest
from datetime import timedelta

import disttest
from disttest import create_tcp_store, find_free_port, retry_on_connect_failures
from disttest.support.stores import ADDRESS_IN_USE


class StoresTest(unittest.TestCase):
    def test_free_port_is_bindable_on_loopback(self):
        port = find_free_port()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))

    def test_free_port_on_every_address(self):
        port = find_free_port("")
        with socket.socket() as s:
            s.bind(("", port))

    @unittest.skipUnless(socket.has_ipv6, "no IPv6 on this host")
    def test_free_port_on_an_ipv6_host(self):
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            self.skipTest("::1 is not configured on this host")
        port = find_free_port("::1")
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", port))

    def test_retries_of_fewer_than_one_are_named_where_applied(self):
        for bad in (0, -1, "3", 2.0, True):
            with self.subTest(tries=bad), self.assertRaises(disttest.ConfigError) as ctx:
                retry_on_connect_failures(lambda: None, tries=bad)
            self.assertIn(f"{bad!r} from retry_on_connect_failures(tries=...)", str(ctx.exception))
        with self.assertRaises(disttest.ConfigError):
            retry_on_connect_failures(tries=0)  # as a decorator factory, too

    def test_tcp_store_listens_on_loopback_and_works(self):
        import psutil

        for libuv in (True, False):
            with self.subTest(use_libuv=libuv):
                store = create_tcp_store(timeout=timedelta(seconds=7), use_libuv=libuv)
                store.set("k", "v")
                self.assertEqual(store.get("k"), b"v")
                self.assertEqual(store.timeout, timedelta(seconds=7))
                with socket.create_connection(("127.0.0.1", store.port), timeout=5):
                    pass
                # (torch's server listened on every interface, '::')
                listening = {c.laddr.ip for c in psutil.Process().net_connections()
                             if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port}
                self.assertEqual(listening, {"127.0.0.1"})
                del store

    def test_tcp_store_timeout_in_seconds_and_bad_ones_named(self):
        self.assertEqual(create_tcp_store(timeout=3).timeout, timedelta(seconds=3))
        for bad in (0, -1, "soon"):
            with self.subTest(bad=bad), self.assertRaises(disttest.ConfigError) as ctx:
                create_tcp_store(timeout=bad)
            self.assertIn(f"Invalid timeout {bad!r} from create_tcp_store(timeout=...)", str(ctx.exception))

    def test_retries_on_connect_errors_only(self):
        calls = []

        @retry_on_connect_failures
        def flaky():
            calls.append(1)
            if len(calls) < 3:
                raise RuntimeError(f"bind: {ADDRESS_IN_USE}")
            return "ok"

        self.assertEqual(flaky(), "ok")
        self.assertEqual(len(calls), 3)

        @retry_on_connect_failures
        def other():
            calls.append(1)
            raise RuntimeError("something unrelated: a d")

        calls.clear()
        with self.assertRaisesRegex(RuntimeError, "unrelated"):
            other()
        self.assertEqual(len(calls), 1)  # upstream retried this (char match)

    def test_gives_up_after_tries(self):
        @retry_on_connect_failures(connect_errors="refused", tries=2)
        def never():
            raise RuntimeError("connection refused")

        with self.assertRaisesRegex(RuntimeError, "failing after 2 tries"):
            never()
