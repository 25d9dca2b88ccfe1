"""Local-tensor mode at scale: faster equivalents of parts of torch's
``LocalTensorMode``, installed for as long as a test needs them.

torch's LocalTensorMode simulates every rank in one thread, but some of its
bookkeeping costs O(world) per op per rank, or O(world^2) per mesh. The
helpers below replace five of its private functions (in seven parts) with
equivalents that give every rank the same values, RNG streams and errors,
for as long as a test needs them (install_local_tensor_speedups returns the
undo). Each part replaces upstream code whose source it was checked against
(fingerprints below): where the installed torch's differs, that part is
left out, so a torch upgrade costs speed, never correctness.
tests/test_simulated.py proves each part against upstream's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from disttest._compat.local_mode import _local_tensor

__unittest = True

__all__ = [
    "LOCAL_TENSOR_SPEEDUPS",
    "SIMULATED_RANK",
    "UNKNOWN_SPEEDUP",
    "install_local_tensor_speedups",
    "local_tensor_speedups_available",
]


#: The parts ``install_local_tensor_speedups`` knows, each replacing upstream
#: code: ``coordinates`` (``_LocalDeviceMesh.get_coordinate``: one pass over
#: the mesh instead of recomputing its layout for every rank), ``rng``
#: (``_for_each_rank_run_func``: no per-rank RNG save and restore for an aten
#: op that draws no random numbers), ``args`` (the same function: per-rank
#: arguments without a pytree unflatten per rank), ``meta``
#: (``_compute_local_tensor_meta`` in one pass), ``enter``
#: (``LocalTensorMode.__enter__``: the ranks share one copy of the RNG state
#: instead of a clone each) and ``dispatch`` (``LocalTensorMode.__torch_dispatch__``:
#: an op on plain tensors runs without a pytree flatten) and ``metadata``
#: (``_for_each_rank_run_func`` again: a LocalTensor's strides, sizes,
#: storage offset and element count read from each rank's tensor by its
#: method, not the op through the dispatcher).
LOCAL_TENSOR_SPEEDUPS = ("coordinates", "rng", "args", "meta", "enter", "dispatch", "metadata")

#: The note on an op's error when it refused one simulated rank's values.
SIMULATED_RANK = "(disttest: {op} raised on simulated rank {rank} of {n})"
UNKNOWN_SPEEDUP = "unknown local-tensor speedup {name!r}; expected some of {known} (disttest)"

# sha256 (first 16 hex digits) of the dedented source of the upstream code
# each part replaces or relies on, per known version of it (torch 2.13, and
# 2.14 where it differs).
_SPEEDUP_SOURCES: dict[str, tuple[str, ...]] = {
    "coordinates": ("_LocalDeviceMesh.get_coordinate",),
    "rng": ("_for_each_rank_run_func", "_map_to_rank_local_val"),
    "args": ("_for_each_rank_run_func", "_map_to_rank_local_val"),
    "meta": ("_compute_local_tensor_meta", "_get_extra_dispatch_keys"),
    "enter": ("LocalTensorMode.__enter__",),
    "dispatch": ("LocalTensorMode.__torch_dispatch__", "_check_for_subclass_arg"),
    "metadata": ("_for_each_rank_run_func", "_map_to_rank_local_val"),
}
# How each known get_coordinate keys the mode's cache: by the mesh's id()
# (2.13), or by what the coordinates are computed from (2.14: the number of
# dimensions, the flattened rank map and the layout).
_COORDINATES_CACHED_BY_VALUE = {"7bb3de11b3803ce7": False, "bf8fa3848729b2a6": True}
_SPEEDUP_FINGERPRINTS: dict[str, frozenset[str]] = {
    "coordinates": frozenset(_COORDINATES_CACHED_BY_VALUE),
    "rng": frozenset({"06a826708f789205"}),
    "args": frozenset({"06a826708f789205"}),
    "meta": frozenset({"04821731ed723a67"}),
    "enter": frozenset({"d74dd2a3056fb1d6"}),
    "dispatch": frozenset({"caf1d052860cf956"}),
    "metadata": frozenset({"06a826708f789205"}),
}


def _fingerprint(lt: Any, names: tuple[str, ...]) -> str | None:
    import hashlib
    import inspect
    import textwrap

    digest = hashlib.sha256()
    for name in names:
        obj: Any = lt
        for part in name.split("."):
            obj = getattr(obj, part, None)
        try:
            digest.update(textwrap.dedent(inspect.getsource(inspect.unwrap(obj))).encode())
        except (OSError, TypeError):  # no source, or no such function
            return None
    return digest.hexdigest()[:16]


def local_tensor_speedups_available() -> tuple[str, ...]:
    """The parts of ``LOCAL_TENSOR_SPEEDUPS`` whose upstream code is the code
    they were checked against (none on a torch without the mode)."""
    from disttest import _compat  # NB: the package's table, which a test may patch

    lt = _local_tensor()
    if lt is None:
        return ()
    return tuple(p for p in LOCAL_TENSOR_SPEEDUPS
                 if _fingerprint(lt, _SPEEDUP_SOURCES[p]) in _compat._SPEEDUP_FINGERPRINTS[p])


def _coordinates_cached_by_value() -> bool:
    """Whether the installed torch's get_coordinate keys its cache by value
    (False where it is not a known version: by id(), as 2.13)."""
    lt = _local_tensor()
    return _COORDINATES_CACHED_BY_VALUE.get(_fingerprint(lt, _SPEEDUP_SOURCES["coordinates"]) or "", False)


def _closed_form_coordinate(mesh: Any, by_value: bool | None = None) -> Any:
    """``_LocalDeviceMesh.get_coordinate`` in O(world). Upstream recomputes
    the layout's rank tensor under the mode once per rank, each of its ops
    running once per rank (O(world^2)); here it is computed once with the mode
    off, and one pass over its values places every rank. Same cache (keyed
    as the installed torch keys it: ``by_value``, looked up when None), lock,
    values (in the same order) and errors; a mesh cached by its id() kept
    alive."""
    import math

    import torch

    lt = _local_tensor()
    lm = lt.enabled_local_tensor_mode()
    if lm is None:
        raise AssertionError("Unexpectedly not in LocalTensorMode")
    if by_value is None:
        by_value = _coordinates_cached_by_value()
    key = (mesh.ndim, mesh._flatten_rank_map, mesh._layout) if by_value else id(mesh)
    cache = lm._coordinate_cache
    if key in cache:
        return cache[key]
    with lm._coordinate_cache_lock:
        if key in cache:
            return cache[key]
        with lm.disable():
            # a clone, as upstream: inference mode forbids using the map itself
            rank_tensor = mesh._layout.remap_to_tensor(mesh._rank_map.clone())
        shape = list(rank_tensor.shape[1:])  # dim 0 enumerates the sibling submeshes
        per_submesh = math.prod(shape)
        where: dict[int, int] = {}
        for index, rank in enumerate(rank_tensor.reshape(-1).tolist()):
            where[rank] = -1 if rank in where else index % per_submesh
        coords: list[dict[int, int]] = [{} for _ in shape]
        for rank in lm.ranks:
            pos = where.get(rank, -1)
            if pos < 0:  # as upstream: each rank must appear exactly once
                raise AssertionError
            for dim in range(len(shape) - 1, -1, -1):
                pos, coords[dim][rank] = divmod(pos, shape[dim])
        out = [torch.SymInt(lt.LocalIntNode(c)) for c in coords]  # type: ignore[no-untyped-call]  # torch: unannotated
        cache[key] = out
        # NB: torch 2.13 keys the cache by id() and lets a cached mesh die, and
        # a mesh made later at its address (a temporary submesh: mesh["a", "b"])
        # gets its coordinates. A cached mesh lives as long as the mode here.
        if not by_value:
            lm.__dict__.setdefault("_disttest_cached_meshes", []).append(mesh)
        return out


def _draws_no_random_numbers(func: Any) -> bool:
    """An aten op torch does not tag ``nondeterministic_seeded`` neither reads
    nor advances a generator (every aten op with a Generator argument has the
    tag). Other callables (custom and higher-order ops, the Python functions
    of ``maybe_run_for_local_tensor``) keep upstream's per-rank RNG."""
    import torch

    return (isinstance(func, torch._ops.OpOverload) and func.namespace == "aten"
            and torch.Tag.nondeterministic_seeded not in func.tags)


def _compile_unflatten(spec: Any, start: int = 0) -> Callable[[list[Any]], Any]:
    """``spec.unflatten(leaves[start:])`` as a closure, resolved once per op
    instead of once per rank: the same node functions and contexts."""
    from torch.utils import _pytree

    if spec.is_leaf():
        return lambda leaves: leaves[start]
    unflatten = _pytree.SUPPORTED_NODES[spec.type].unflatten_fn
    context = spec.context
    children = list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)
    if all(child.is_leaf() for child in children):
        end = start + len(children)
        return lambda leaves: unflatten(leaves[start:end], context)
    parts = []
    for child in children:
        parts.append(_compile_unflatten(child, start))
        start += child.num_leaves
    return lambda leaves: unflatten([part(leaves) for part in parts], context)


def _metadata_reads() -> dict[Any, Callable[[Any], Any]]:
    """The metadata ops of the ``metadata`` part, each as the tensor method
    that answers it for one rank's plain tensor (0.3 us, against 3 us for
    the op through the dispatcher), giving what the op gives (a list where
    it gives one)."""
    import torch

    aten, tensor = torch.ops.aten, torch.Tensor
    return {
        aten.sym_stride.default: lambda t: list(tensor.stride(t)),
        aten.sym_size.default: lambda t: list(tensor.size(t)),
        aten.sym_storage_offset.default: tensor.storage_offset,
        aten.sym_numel.default: tensor.numel,
    }


def _read_each_rank(read: Callable[[Any], Any], ranks: Any, args: Any, kwargs: Any,
                    local_tensor: Any) -> dict[int, Any] | None:
    """Each rank's answer to a metadata op on one LocalTensor, in rank
    order; None where the call is not that (upstream's loop then runs it,
    and raises what it raises)."""
    if kwargs or len(args) != 1 or type(args[0]) is not local_tensor:
        return None
    local = args[0]._local_tensors
    try:
        return {rank: read(local[rank]) for rank in sorted(ranks)}
    except Exception:  # noqa: BLE001 (a sparse tensor's strides...: upstream's loop gives the error)
        return None


_NO_KWARGS: dict[str, Any] = {}


def _fast_for_each_rank(upstream: Callable[..., Any], fast_rng: bool, fast_args: bool,
                        fast_metadata: bool = False) -> Callable[..., Any]:
    """``_for_each_rank_run_func``, with the per-rank RNG round trip skipped
    for an op that draws no random numbers (``fast_rng``), the per-rank
    arguments built by a compiled unflatten (``fast_args``) and a
    LocalTensor's metadata read from each rank's tensor (``fast_metadata``).

    Upstream sets each rank's saved RNG state before the op and saves it
    after. For an op that draws none the state it saves is the one it set, so
    all that can be seen is where the generator is left: at the last rank's
    state (the failing rank's, on an error), which is set once."""
    import torch
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.fx.experimental._constant_symnode import ConstantIntNode
    from torch.utils import _pytree
    from torch.utils._python_dispatch import return_and_correct_aliasing

    lt = _local_tensor()
    LocalTensor, LocalIntNode = lt.LocalTensor, lt.LocalIntNode
    reads = _metadata_reads() if fast_metadata else {}

    def run(func: Any, ranks: Any, args: Any, kwargs: Any, *, alias: bool = True) -> Any:
        lm = lt.enabled_local_tensor_mode()
        states = lm._per_rank_rng_states if lm is not None else {}
        per_rank_rng = len(states) > 0
        skip_rng = fast_rng and _draws_no_random_numbers(func) and (not per_rank_rng or states.keys() >= ranks)
        read = reads.get(func)
        if read is not None and (not per_rank_rng or states.keys() >= ranks):
            answers = _read_each_rank(read, ranks, args, kwargs, LocalTensor)
            if answers is not None:
                # (upstream's loop leaves the generator at the last rank's state)
                if per_rank_rng and answers:
                    lt._set_rng_state(*states[max(answers)])
                ret = lt._combine_rank_results(answers, None)
                return return_and_correct_aliasing(func, args, kwargs, ret) if alias else ret  # type: ignore[no-untyped-call]  # torch: unannotated
        if not (skip_rng or fast_args):
            return upstream(func, ranks, args, kwargs, alias=alias)
        flat_args, spec = _pytree.tree_flatten((args, kwargs))
        flat_args = [a.wait() if isinstance(a, AsyncCollectiveTensor) else a for a in flat_args]
        # upstream's _map_to_rank_local_val, decided once per argument
        base = list(flat_args)
        varying: list[tuple[int, dict[int, Any]]] = []
        for i, a in enumerate(flat_args):
            if isinstance(a, LocalTensor):
                varying.append((i, a._local_tensors))
            elif isinstance(a, torch.SymInt):
                if isinstance(a.node, LocalIntNode):
                    varying.append((i, a.node._local_ints))
                elif isinstance(a.node, ConstantIntNode):
                    base[i] = a.node.val
        build_args = build_kwargs = None
        if fast_args:
            args_spec, kwargs_spec = spec.children() if hasattr(spec, "children") else spec.children_specs
            build_args = _compile_unflatten(args_spec)
            if kwargs_spec.num_leaves:
                build_kwargs = _compile_unflatten(kwargs_spec, args_spec.num_leaves)
        global_state = None if skip_rng or per_rank_rng else lt._get_rng_state()
        is_hash = func is torch.ops.aten.hash_tensor.default
        is_split = func is torch.ops.aten.split.Tensor
        results: dict[int, Any] = {}
        default_value = None
        rank = None
        try:
            for rank in sorted(ranks):
                if not skip_rng:
                    if per_rank_rng:
                        if rank in states:
                            lt._set_rng_state(*states[rank])
                    else:
                        lt._set_rng_state(*cast(tuple[Any, ...], global_state))
                rank_flat = base.copy()
                for i, per_rank in varying:
                    rank_flat[i] = per_rank[rank]
                if build_args is None:
                    rank_args, rank_kwargs = spec.unflatten(rank_flat)
                else:
                    rank_args = build_args(rank_flat)
                    rank_kwargs = _NO_KWARGS if build_kwargs is None else build_kwargs(rank_flat)
                if is_hash and rank_args[0].numel() == 0:
                    results[rank] = torch.empty(0, dtype=torch.uint64, device=rank_args[0].device)
                else:
                    results[rank] = func(*rank_args, **rank_kwargs)
                if per_rank_rng and not skip_rng:
                    states[rank] = lt._get_rng_state()
                if default_value is None and is_split:
                    split_dim = 0 if len(rank_flat) < 3 else rank_flat[2]
                    default_value = lt._zero_sized_like(rank_flat[0], split_dim)
        except Exception as e:
            # (which rank's values the op refused: the error names none)
            if rank is not None and hasattr(e, "add_note"):
                e.add_note(SIMULATED_RANK.format(rank=rank, op=func, n=len(ranks)))
            raise
        finally:
            if skip_rng and per_rank_rng and rank is not None:
                lt._set_rng_state(*states[rank])
        if lt._is_inplace_op(func):
            ret = args[0]
            if torch.Tag.inplace_view in func.tags:
                ret._sync_meta()
            return ret
        ret = lt._combine_rank_results(results, default_value)
        return return_and_correct_aliasing(func, args, kwargs, ret) if alias else ret  # type: ignore[no-untyped-call]  # torch: unannotated

    return run


def _one_pass_tensor_meta(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """``_compute_local_tensor_meta`` in one pass where every rank's shard has
    one shape: the same checks in the same order, the same errors and result
    (strides as a LocalIntNode only where ranks differ); upstream's where
    shapes differ."""
    import torch

    lt = _local_tensor()
    mismatch = "Tensors representing LocalTensor shards must have the same {}"

    def meta(local_tensors: dict[int, Any]) -> Any:
        values = list(local_tensors.values())
        first = values[0]
        dtype, layout = first.dtype, first.layout
        extra = lt._get_extra_dispatch_keys(first)
        # upstream's extra keys are Conjugate and Negative: the conj and neg bits
        bits = (first.is_conj(), first.is_neg())
        shape, stride = first.shape, first.stride()
        same_shape = same_stride = True
        for t in values[1:]:
            if dtype != t.dtype:
                raise AssertionError(mismatch.format("dtype"))
            if layout != t.layout:
                raise AssertionError(mismatch.format("layout"))
            if bits != (t.is_conj(), t.is_neg()):
                raise AssertionError(mismatch.format("set of extra dispatch keys"))
            same_shape = same_shape and t.shape == shape
            same_stride = same_stride and t.stride() == stride
        if not same_shape:
            return upstream(local_tensors)
        strides: list[Any] = list(stride)
        if not same_stride:
            for d in range(len(shape)):
                per_rank = {r: t.stride(d) for r, t in local_tensors.items()}
                if any(v != stride[d] for v in per_rank.values()):
                    strides[d] = torch.SymInt(lt.LocalIntNode(per_rank))  # type: ignore[no-untyped-call]  # torch: unannotated
        return list(shape), strides, first.device, dtype, layout, extra

    return meta


def _shared_state_enter(mode: Any) -> Any:
    """``LocalTensorMode.__enter__`` with the ranks sharing one copy of the
    generator's state instead of a clone each (upstream clones world-size
    states on every entry, and LocalTensor's own dispatch enters a new mode
    for every op it sees). Safe because no saved state is written in place:
    upstream only replaces them (``_per_rank_rng_states[rank] = ...``) and
    copies from them (``set_rng_state``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    lt = _local_tensor()
    lt.get_local_tensor_mode_list().append(mode)
    mode.enable_()
    if not lt._is_in_fake_tensor_mode():
        shared = lt._get_rng_state()  # fresh tensors, owned by no one else
        states = mode._per_rank_rng_states
        for rank in mode.ranks:
            states[rank] = shared
    return TorchDispatchMode.__enter__(mode)  # type: ignore[no-untyped-call]  # torch: unannotated


def _plain_dispatch(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """``LocalTensorMode.__torch_dispatch__`` with a short path for an op
    whose arguments hold tensors of the plain kinds only (no LocalTensor, no
    other subclass): the ops a per-rank function runs on one rank's tensors,
    which upstream runs unchanged after flattening their arguments with
    pytree. An argument it cannot see through at a glance (a container other
    than a list, tuple or Size) sends the op to upstream."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree

    nodes = _pytree.SUPPORTED_NODES
    plain = (torch.Tensor, FakeTensor, torch.nn.Parameter, torch.nn.Buffer)  # upstream's _check_for_subclass_arg
    sequences = (list, tuple, torch.Size)
    mesh_ops = getattr(torch.ops, "device_mesh", None)
    coordinate_op = getattr(getattr(mesh_ops, "_runtime_compute_coordinate_on_dim", None), "default", None)

    def count(values: Any) -> int:
        """How many plain tensors ``values`` holds; -1 if anything else."""
        found = 0
        for a in values:
            kind = type(a)
            if kind in plain:
                found += 1
            elif kind in sequences:
                inner = count(a)
                if inner < 0:
                    return -1
                found += inner
            elif isinstance(a, (torch.Tensor, tuple, list, dict)) or kind in nodes:
                return -1
        return found

    def dispatch(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not types and func is not coordinate_op:
            found = count(args)
            if found >= 0 and kwargs:
                more = count(kwargs.values())
                found = -1 if more < 0 else found + more
            # upstream: no LocalTensor, and a tensor among the arguments or the
            # mode disabled: the op as it is
            if found > 0 or (found == 0 and mode._disable):
                return func(*args, **(kwargs or _NO_KWARGS))
        return upstream(mode, func, types, args, kwargs)

    return dispatch


def install_local_tensor_speedups(parts: Any = LOCAL_TENSOR_SPEEDUPS) -> Callable[[], None]:
    """Replace the upstream code behind ``parts`` (names from
    ``LOCAL_TENSOR_SPEEDUPS``; those not in ``local_tensor_speedups_available()``
    are left out) in torch's local-tensor module; return the undo, which puts
    back exactly what was there. Install before entering a LocalTensorMode and
    undo after leaving it (an entered mode keeps the mesh methods it found).

    Private API: ``torch.distributed._local_tensor``'s
    ``_LocalDeviceMesh.get_coordinate``, ``_for_each_rank_run_func``,
    ``_compute_local_tensor_meta``, ``LocalTensorMode.__enter__`` and
    ``__torch_dispatch__``, and what they use (``_per_rank_rng_states``,
    ``_coordinate_cache``, ``_get_rng_state``, ``_combine_rank_results``...).
    """
    chosen = tuple(parts)
    for name in chosen:
        if name not in LOCAL_TENSOR_SPEEDUPS:
            raise ValueError(UNKNOWN_SPEEDUP.format(name=name, known=LOCAL_TENSOR_SPEEDUPS))
    lt = _local_tensor()
    usable = set(chosen) & set(local_tensor_speedups_available())
    saved: list[tuple[Any, str, Any]] = []

    def replace(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    def undo() -> None:
        while saved:
            owner, name, value = saved.pop()
            setattr(owner, name, value)

    try:  # (all or nothing: an interrupt part-way left torch patched for the rest of the process)
        if "coordinates" in usable:
            by_value = _coordinates_cached_by_value()

            def get_coordinate(mesh: Any) -> Any:  # a function: the mode sets it on DeviceMesh as a method
                return _closed_form_coordinate(mesh, by_value)

            replace(lt._LocalDeviceMesh, "get_coordinate", staticmethod(get_coordinate))
        if usable & {"rng", "args", "metadata"}:
            replace(lt, "_for_each_rank_run_func",
                    _fast_for_each_rank(lt._for_each_rank_run_func, "rng" in usable, "args" in usable,
                                        "metadata" in usable))
        if "meta" in usable:
            replace(lt, "_compute_local_tensor_meta", _one_pass_tensor_meta(lt._compute_local_tensor_meta))
        if "enter" in usable:
            replace(lt.LocalTensorMode, "__enter__", _shared_state_enter)
        if "dispatch" in usable:
            replace(lt.LocalTensorMode, "__torch_dispatch__", _plain_dispatch(lt.LocalTensorMode.__torch_dispatch__))
    except BaseException:
        undo()
        raise
    return undo
