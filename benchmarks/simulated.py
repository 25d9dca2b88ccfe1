"""Simulated worlds (torch's LocalTensorMode): disttest's speedups vs upstream's code.

One test body, run by :class:`disttest.SimulatedTestCase` at each world size:
a cubic 3-D mesh, ``distribute_tensor`` onto it ([Shard(0), Shard(1),
Replicate()]), ``redistribute`` to [Replicate(), Shard(0), Shard(1)] and
``full_tensor``, compared with the input. Each figure is one test (setUp,
body, cleanups) in a fresh interpreter, after a warm-up test at 8 ranks that
pays for the imports; three variants run side by side:

- ``upstream``: ``speedups = ()``, torch's own LocalTensorMode code;
- ``coordinates``: only the closed-form mesh coordinates;
- ``disttest``: every speedup (the default).

Two ways to build the mesh: with the mode disabled (``self.mesh()``, as
upstream's local DTensor bases do; the main table) and inside the mode
(``init_device_mesh`` in the body, ``--inside-sizes``), where the mesh's rank
map is itself a LocalTensor and upstream's coordinates cost grows with the
square of the world. A run over ``--limit`` seconds is shown as such.

    .venv/bin/python benchmarks/simulated.py [--sizes 64,512,1728,4096]
        [--inside-sizes 64,216,512] [--limit 600] [--json OUT]

``--json`` writes one row per size (``size``, ``seconds`` and ``upstream``
for benchmarks/scale.py's plot, with ``cpu``, ``ratio``, ``coordinates`` and
the inside-the-mode figures).

Target (issue 26): 4096 ranks (16x16x16) within 10 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import unittest

VARIANTS = {"upstream": (), "coordinates": ("coordinates",), "disttest": None}


def worker(size: int, variant: str, inside: bool) -> dict[str, float]:
    """In a fresh interpreter: the warm-up test at 8 ranks, then the test at ``size``."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import disttest

    class Redistribute(disttest.SimulatedTestCase):
        def test_redistribute(self) -> None:
            side = round(self.world_size ** (1 / 3))
            shape = (side, side, side)
            mesh = init_device_mesh("cpu", shape) if inside else self.mesh(*shape)
            x = torch.arange(float(side * side * 8)).reshape(side * 4, side * 2)
            d = distribute_tensor(x, mesh, [Shard(0), Shard(1), Replicate()])
            moved = d.redistribute(mesh, [Replicate(), Shard(0), Shard(1)])
            self.assertEqual(moved.full_tensor(), x)

    speedups = VARIANTS[variant]
    if speedups is not None:
        Redistribute.speedups = speedups
    out: dict[str, float] = {}
    for key, world in (("first", 8), ("seconds", size)):
        Redistribute.world_size = world
        result = unittest.TestResult()
        wall, cpu = time.perf_counter(), time.process_time()
        Redistribute("test_redistribute").run(result)
        out[key], out[f"{key}_cpu"] = time.perf_counter() - wall, time.process_time() - cpu
        if not result.wasSuccessful():
            raise SystemExit(f"{variant} at {world}: {(result.errors + result.failures)[0][1]}")
    return out


def measure(size: int, variant: str, inside: bool, limit: float) -> dict[str, float] | None:
    """``worker`` in a fresh interpreter; None when it passes ``limit`` seconds."""
    cmd = [sys.executable, __file__, "--worker", str(size), variant, "inside" if inside else "outside"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def show(figure: dict[str, float] | None, limit: float) -> str:
    return f"> {limit:.0f} s" if figure is None else f"{figure['seconds']:.2f} ({figure['seconds_cpu']:.2f})"


def table(title: str, sizes: list[int], inside: bool, limit: float, rows: dict[int, dict[str, object]]) -> None:
    print(f"\n{title}: seconds per test, wall (cpu)")
    print(f"{'ranks':>6} {'mesh':>10} {'upstream':>16} {'coordinates':>16} {'disttest':>16} {'ratio':>7}")
    prefix = "inside_" if inside else ""
    for size in sizes:
        figures = {v: measure(size, v, inside, limit) for v in VARIANTS}
        up, ours = figures["upstream"], figures["disttest"]
        ratio = f"{ours['seconds'] / up['seconds']:.3f}" if up and ours else "-"
        side = round(size ** (1 / 3))
        print(f"{size:>6} {f'{side}x{side}x{side}':>10} {show(up, limit):>16} {show(figures['coordinates'], limit):>16} "
              f"{show(ours, limit):>16} {ratio:>7}", flush=True)
        row = rows.setdefault(size, {"size": size})
        for variant, key in (("disttest", "seconds"), ("upstream", "upstream"), ("coordinates", "coordinates")):
            fig = figures[variant]
            row[prefix + key] = None if fig is None else fig["seconds"]
            row[prefix + key + "_cpu"] = None if fig is None else fig["seconds_cpu"]
        row[prefix + "ratio"] = None if not (up and ours) else ours["seconds"] / up["seconds"]
        if not inside and ours:
            row["first"] = ours["first"]


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        print(json.dumps(worker(int(sys.argv[2]), sys.argv[3], sys.argv[4] == "inside")))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,512,1728,4096", help="world sizes (cubes), comma-separated")
    parser.add_argument("--inside-sizes", default="64,216,512",
                        help="world sizes for the mesh built inside the mode ('' for none)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per interpreter (default 600)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        inside = [int(s) for s in args.inside_sizes.split(",") if s]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r} / --inside-sizes {args.inside_sizes!r}: expected integers")
    bad = [s for s in sizes + inside if s < 8 or round(s ** (1 / 3)) ** 3 != s]
    if bad:
        parser.error(f"world sizes {bad}: expected cubes of at least 8 (a 3-D mesh)")
    import torch

    from disttest import _compat

    print(f"torch {torch.__version__}; speedups available: {', '.join(_compat.local_tensor_speedups_available())}")
    rows: dict[int, dict[str, object]] = {}
    table("mesh built with the mode disabled (self.mesh())", sizes, False, args.limit, rows)
    if inside:
        table("mesh built inside the mode (init_device_mesh in the body)", inside, True, args.limit, rows)
    firsts = [r["first"] for r in rows.values() if "first" in r]
    if firsts:
        print(f"\nfirst simulated test in a process (8 ranks, imports included): {min(firsts):.2f} s")  # type: ignore[type-var]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sorted(rows.values(), key=lambda r: r["size"]), f, indent=1)  # type: ignore[arg-type, return-value]
    return 0


if __name__ == "__main__":
    sys.exit(main())
