"""Free ports, connect retries and TCP stores, on loopback by default."""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from disttest._typing import F
from disttest.config import ConfigError, parse_timeout

__unittest = True

__all__ = [
    "ADDRESS_IN_USE",
    "CONNECT_TIMEOUT",
    "LOOPBACK",
    "create_tcp_store",
    "find_free_port",
    "retry_on_connect_failures",
]

LOOPBACK = "127.0.0.1"
ADDRESS_IN_USE = "Address already in use"
CONNECT_TIMEOUT = "connect() timed out."
RETRIES_EXHAUSTED = "failing after {n} tries with a connect error (disttest): {error}"


def find_free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` (loopback) a moment ago.

    Another process may take it before you bind: pair this with
    :func:`retry_on_connect_failures`, or let the store pick (port 0).
    """
    # The host's own family: "::1" or an IPv6 name needs an AF_INET6 socket.
    # ("": every address, as bind takes it)
    family, kind, proto, _, address = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    with contextlib.closing(socket.socket(family, kind, proto)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        return int(sock.getsockname()[1])


def retry_on_connect_failures(
    func: F | None = None,
    connect_errors: str | Sequence[str] = (ADDRESS_IN_USE,),
    tries: int = 10,
) -> Any:
    """Call ``func`` again (up to ``tries`` times in all) when it raises a
    RuntimeError whose message contains one of ``connect_errors``.

    NB: upstream's default, ``(ADDRESS_IN_USE)``, is a string, not a tuple,
    so it matched any error sharing one character with it; a single string is
    taken here as one error text.
    """
    if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
        raise ConfigError("number of tries", tries, "retry_on_connect_failures(tries=...)",
                          "expected an integer >= 1")
    if func is None:
        return functools.partial(
            retry_on_connect_failures, connect_errors=connect_errors, tries=tries
        )
    errors = (connect_errors,) if isinstance(connect_errors, str) else tuple(connect_errors)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(1, tries + 1):
            try:
                return func(*args, **kwargs)
            except RuntimeError as error:
                if not any(e in str(error) for e in errors):
                    raise
                if attempt == tries:
                    raise RuntimeError(RETRIES_EXHAUSTED.format(n=tries, error=error)) from error
                time.sleep(random.uniform(0.01, 0.2))
        raise AssertionError("unreachable: tries >= 1")  # (for the type checker)

    return wrapper


@retry_on_connect_failures
def create_tcp_store(
    addr: str = LOOPBACK,
    world_size: int = 1,
    is_master: bool = True,
    timeout: timedelta = timedelta(minutes=5),
    wait_for_workers: bool = True,
    jit_class: bool = False,
    use_libuv: bool = True,
) -> Any:
    """A TCPStore server on ``addr`` (loopback) at a free port.

    ``store.port`` tells the port. ``timeout`` is honoured (upstream drops
    it for the non-jit store): a ``timedelta``, or seconds.
    """
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=parse_timeout(timeout, "create_tcp_store(timeout=...)"))
    if jit_class:
        ms = int(timeout / timedelta(milliseconds=1))
        return torch.classes.dist_c10d.TCPStore(addr, find_free_port(addr), world_size, is_master, ms)
    if not is_master:
        return dist.TCPStore(addr, find_free_port(addr), world_size, is_master,
                             timeout=timeout, wait_for_workers=wait_for_workers, use_libuv=use_libuv)
    # NB: torch's server listens on every interface whatever ``addr`` says;
    # given a socket bound to ``addr`` (port 0: the OS picks, no window for a
    # clash), it listens there alone. The store owns the socket from then on.
    family, kind, proto, _, address = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.bind(address)
        listener.listen(128)
        port = listener.getsockname()[1]
    except BaseException:
        listener.close()
        raise
    return dist.TCPStore(addr, port, world_size, is_master, timeout=timeout, wait_for_workers=wait_for_workers,
                         master_listen_fd=listener.detach(), use_libuv=use_libuv)
