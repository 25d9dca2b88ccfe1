"""Where a rank learns who it is: torchrun, Slurm and Open MPI environments.

An external launcher starts one process per rank and tells it its rank, the
world size, its rank on the node and where rank 0 listens, each in its own
variables:

- torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``;
- Slurm (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, and
  rank 0's host is the first of ``SLURM_STEP_NODELIST`` (``node[01-03,07]``,
  expanded as ``scontrol show hostnames`` does);
- Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``; rank 0's host from ``MASTER_ADDR`` (Open MPI
  does not publish it; a one-node job uses 127.0.0.1).

:func:`detect` reads them (first match in that order: a torchrun inside an
``srun`` step wins), :func:`export` writes the result as the variables
c10d's ``env://`` rendezvous reads. A bad value raises
:class:`~disttest.config.ConfigError` naming the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from disttest.config import ConfigError

__unittest = True

__all__ = [
    "DEFAULT_MASTER_PORT",
    "LAUNCHER_DISAGREES",
    "MAX_HOSTS",
    "LaunchEnv",
    "detect",
    "expand_hostlist",
    "export",
    "first_host",
    "resolve_rank",
]

#: Why a rank or world size that the launcher contradicts is refused.
LAUNCHER_DISAGREES = "the launcher ({launcher}) gives this process a {what} of {launched}"

#: The port rank 0 listens on when neither the caller nor the launcher says
#: (torchrun's default). Under Slurm the job id picks one instead, so two
#: jobs sharing a node do not collide.
DEFAULT_MASTER_PORT = 29500
_SLURM_PORT_BASE, _SLURM_PORT_SPAN = 15000, 20000

NO_LAUNCHER = (
    "none found: set RANK and WORLD_SIZE (torchrun), "
    "run under srun (SLURM_PROCID) or mpirun (OMPI_COMM_WORLD_RANK), or pass rank and world_size"
)
OMPI_NEEDS_MASTER = (
    "expected MASTER_ADDR (e.g. mpirun -x MASTER_ADDR=<host of rank 0>) when the "
    "Open MPI job spans several nodes"
)


@dataclass(frozen=True)
class LaunchEnv:
    """One rank's place in a launched job, and where its variables came from."""

    launcher: str  # "torchrun", "slurm" or "openmpi"
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _int(env: Mapping[str, str], name: str, what: str, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        raise ConfigError(what, raw, f"environment variable {name}", "it is not set")
    digits = raw.strip().removeprefix("-")  # (a negative one is refused for its value below)
    if not (digits.isascii() and digits.isdigit()):  # (int() reads "1_0" as 10, and other scripts' digits)
        raise ConfigError(what, raw, f"environment variable {name}", f"expected an integer >= {minimum}")
    value = int(raw.strip())
    if value < minimum:
        raise ConfigError(what, raw, f"environment variable {name}", f"expected an integer >= {minimum}")
    return value


def _port(raw: object, where: str) -> int:
    why = "expected a TCP port, 1 to 65535"
    digits = str(raw).strip()
    if isinstance(raw, bool) or not (digits.isascii() and digits.isdigit()):  # (int() reads "1_0", "٣")
        raise ConfigError("master port", raw, where, why)
    port = int(digits)
    if not 0 < port < 65536:
        raise ConfigError("master port", raw, where, why)
    return port


def _split_top(spec: str) -> list[str]:
    """Split a Slurm host list on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    parts.append(spec[start:])
    return parts


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_one(host: str, spec: str, where: str) -> list[str]:
    parsed = _brackets(host, spec, where)
    if parsed is None:
        return [host]
    head, ranges, tail = parsed
    names = []
    for lo, hi in ranges:
        width = len(lo)  # node[01-03]: zero-padded to the width of the first bound
        names += [f"{head}{n:0{width}d}" for n in range(int(lo), int(hi) + 1)]
    return [name + suffix for name in names for suffix in _expand_one_tail(tail, spec, where)]


def _expand_one_tail(tail: str, spec: str, where: str) -> list[str]:
    return _expand_one(tail, spec, where) if tail else [""]


#: The most hosts :func:`expand_hostlist` lists (a Slurm job names far fewer);
#: a longer list is refused before any name is made, not expanded.
MAX_HOSTS = 100_000


def expand_hostlist(spec: str, where: str = "host list") -> list[str]:
    """The host names of a Slurm host list, in order, as ``scontrol show
    hostnames`` prints them: ``node[01-03,07]`` is node01, node02, node03,
    node07; ``a,b[1-2]`` is a, b1, b2. Raises ConfigError naming ``where``,
    also for a list of more than :data:`MAX_HOSTS` hosts (counted, not
    expanded)."""
    parts = _parts(spec, where)
    total = sum(_count_one(part, spec, where) for part in parts)
    if total > MAX_HOSTS:
        raise ConfigError("host list", spec, where,
                          f"it names {total} hosts, more than the {MAX_HOSTS} disttest expands")
    hosts: list[str] = []
    for part in parts:
        hosts += _expand_one(part, spec, where)
    return hosts


def first_host(spec: str, where: str = "host list") -> str:
    """The first host of a Slurm host list, checked whole but never
    expanded: ``n[0-999999999]`` costs as little as ``n[0-1]``."""
    parts = _parts(spec, where)
    for part in parts:
        _count_one(part, spec, where)  # the whole list is checked
    return _first_one(parts[0])


def _parts(spec: str, where: str) -> list[str]:
    if not spec.strip():
        raise ConfigError("host list", spec, where, "it is empty")
    return [part.strip() for part in _split_top(spec.strip())]


def _brackets(host: str, spec: str, where: str) -> tuple[str, list[tuple[str, str]], str] | None:
    """``head[ranges]tail`` as (head, [(lo, hi)...], tail); None without brackets."""
    if "[" not in host:
        if "]" in host or not host:
            raise ConfigError("host list", spec, where, "expected hosts such as node[01-03,07]")
        return None
    head, _, rest = host.partition("[")
    body, closed, tail = rest.partition("]")
    if not closed or not body:
        raise ConfigError("host list", spec, where, "unbalanced brackets")
    ranges = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if m is None:
            raise ConfigError("host list", spec, where, f"bad range {item!r} in brackets")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ConfigError("host list", spec, where, f"range {item!r} runs backwards")
        ranges.append((lo, hi))
    return head, ranges, tail


def _count_one(host: str, spec: str, where: str) -> int:
    parsed = _brackets(host, spec, where)
    if parsed is None:
        return 1
    _, ranges, tail = parsed
    names = sum(int(hi) - int(lo) + 1 for lo, hi in ranges)
    return names * (_count_one(tail, spec, where) if tail else 1)


def _first_one(host: str) -> str:
    parsed = _brackets(host, host, "host list")
    if parsed is None:
        return host
    head, ranges, tail = parsed
    return head + ranges[0][0] + (_first_one(tail) if tail else "")


def _slurm_port(env: Mapping[str, str]) -> int:
    job = env.get("SLURM_JOB_ID", "").strip()
    if job.isdigit():
        return _SLURM_PORT_BASE + int(job) % _SLURM_PORT_SPAN
    return DEFAULT_MASTER_PORT


def detect(
    environ: Mapping[str, str] | None = None,
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> LaunchEnv:
    """This process's rank, world size, local rank and master, from its launcher.

    ``master_addr``/``master_port`` given win over the environment; without
    them ``MASTER_ADDR``/``MASTER_PORT`` win over what the launcher implies
    (the first host of the Slurm step, a port from the Slurm job id). Raises
    ConfigError naming the variable when one is missing or bad, or when no
    launcher's variables are set.
    """
    env = os.environ if environ is None else environ
    if env.get("RANK") is not None and env.get("WORLD_SIZE") is not None:
        launcher = "torchrun"
        rank = _int(env, "RANK", "rank", 0)
        world = _int(env, "WORLD_SIZE", "world size", 1)
        local = _int(env, "LOCAL_RANK", "local rank", 0) if env.get("LOCAL_RANK") else rank
        rank_var, local_var = "RANK", "LOCAL_RANK"
        implied_addr: str | None = "127.0.0.1"
        implied_port = DEFAULT_MASTER_PORT
    elif env.get("SLURM_PROCID") is not None:
        launcher = "slurm"
        rank = _int(env, "SLURM_PROCID", "rank", 0)
        ntasks = "SLURM_NTASKS" if env.get("SLURM_NTASKS") is not None else "SLURM_NPROCS"
        world = _int(env, ntasks, "world size", 1)
        local = _int(env, "SLURM_LOCALID", "local rank", 0) if env.get("SLURM_LOCALID") else 0
        rank_var, local_var = "SLURM_PROCID", "SLURM_LOCALID"
        nodes = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                      if env.get(v)), None)
        implied_addr = first_host(env[nodes], f"environment variable {nodes}") if nodes else None
        implied_port = _slurm_port(env)
    elif env.get("OMPI_COMM_WORLD_RANK") is not None:
        launcher = "openmpi"
        rank = _int(env, "OMPI_COMM_WORLD_RANK", "rank", 0)
        world = _int(env, "OMPI_COMM_WORLD_SIZE", "world size", 1)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "local rank", 0)
        rank_var, local_var = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"
        local_size = env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "").strip()
        implied_addr = "127.0.0.1" if local_size == str(world) else None
        implied_port = DEFAULT_MASTER_PORT
    else:
        raise ConfigError("launcher environment", "", "the environment", NO_LAUNCHER)
    if rank >= world:
        raise ConfigError("rank", rank, f"environment variable {rank_var}",
                          f"expected a rank below the world size {world}")
    if local >= world:
        raise ConfigError("local rank", local, f"environment variable {local_var}",
                          f"expected a local rank below the world size {world}")
    if master_addr is not None and not master_addr.strip():
        raise ConfigError("master address", master_addr, "master_addr", "it is blank")
    if env.get("MASTER_ADDR") is not None and not env["MASTER_ADDR"].strip():
        raise ConfigError("master address", env["MASTER_ADDR"], "environment variable MASTER_ADDR",
                          "it is blank; unset it or name the master host")
    addr = master_addr or env.get("MASTER_ADDR") or implied_addr
    if not addr:
        why = OMPI_NEEDS_MASTER if launcher == "openmpi" else "expected MASTER_ADDR or a node list"
        raise ConfigError("master address", None, "environment variable MASTER_ADDR", why)
    if master_port is not None:
        port = _port(master_port, "master_port")
    elif env.get("MASTER_PORT"):
        port = _port(env["MASTER_PORT"], "environment variable MASTER_PORT")
    else:
        port = implied_port
    return LaunchEnv(launcher, rank, world, local, addr, port)


def export(launch: LaunchEnv, environ: MutableMapping[str, str] | None = None) -> None:
    """Write ``launch`` as the variables ``env://`` reads (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""
    env = os.environ if environ is None else environ
    env["RANK"] = str(launch.rank)
    env["WORLD_SIZE"] = str(launch.world_size)
    env["LOCAL_RANK"] = str(launch.local_rank)
    env["MASTER_ADDR"] = launch.master_addr
    env["MASTER_PORT"] = str(launch.master_port)


def resolve_rank(rank: int | None, world_size: int | None, rendezvous_given: bool,
                 declared: int | None = None, declared_where: str = "") -> tuple[int, int]:
    """``run_rank``'s rank and world size: as given, else from the launcher.

    Without a rendezvous file the launcher's values are exported for
    ``env://``. A rank or world size given (or ``declared`` by the test
    class, at ``declared_where``) that the launcher contradicts is refused at
    once, naming both, instead of a rendezvous that waits for ranks that
    never come.
    """
    try:
        launch: LaunchEnv | None = detect()
    except ConfigError:
        if rank is None or world_size is None:
            raise
        launch = None  # both given and no usable launcher: nothing to check against
    if launch is None:
        assert rank is not None and world_size is not None
        return rank, world_size
    for what, value, where, launched in (
        ("world size", world_size, "run_rank(world_size=...)", launch.world_size),
        ("world size", declared if world_size is None else None, declared_where, launch.world_size),
        ("rank", rank, "run_rank(rank=...)", launch.rank),
    ):
        if value is not None and value != launched:
            raise ConfigError(what, value, where, LAUNCHER_DISAGREES.format(
                launcher=launch.launcher, what=what, launched=launched))
    if rank is not None and world_size is not None:
        return rank, world_size
    if not rendezvous_given:
        export(launch)
    return (launch.rank if rank is None else rank,
            launch.world_size if world_size is None else world_size)
