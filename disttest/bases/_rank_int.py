"""``self.rank`` of a simulated test: torch's per-rank int made to say when
the ranks' answers differ (:class:`RankSplit`), with the arithmetic torch's
lacks, and the check that a Python value made of per-rank tensors has one
answer (:func:`_answers_split`). Used by :mod:`disttest.bases.simulated`,
which re-exports its public names."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch

from disttest import _compat
from disttest.pg._local import rank_runs

__unittest = True

__all__ = ["RANK_NOT_INT", "RANK_SPLIT", "SHOWN_RANKS", "RankSplit"]

#: A comparison (or ``int()``, an index) of ``self.rank`` in a simulated test,
#: or of an int made from it, whose answer differs between the ranks: every
#: rank runs the line at once, so no one answer can be given (torch's own
#: per-rank int answered ``==`` with False for every rank, rank 0 included).
RANK_SPLIT = ("{what} has no one answer in a simulated test (disttest): every rank runs this line at once, "
              "and their answers differ ({answers}); a simulated test cannot branch on its rank: make the "
              "per-rank values with self.mode.rank_map(lambda rank: ...) and check them with assertRanksEqual")
#: An operation on ``self.rank`` whose per-rank answer is not an int (``self.rank / 2``, ``** -1``).
RANK_NOT_INT = ("{op} of a per-rank int (self.rank, or an int made from it) is not simulated (disttest): its "
                "arithmetic gives per-rank ints only (+, -, *, //, %, ** by a natural number, <<, >>, &, |, ^, "
                "abs, math.floor, ceil and trunc); make per-rank values of other kinds with self.mode.rank_map(lambda rank: ...)")
#: How many differing ranks (of :class:`RankSplit`: answers) a failure shows.
SHOWN_RANKS = 5


class RankSplit(Exception):  # noqa: N818 (upstream-style name, kept)
    """A comparison of a simulated test's ``self.rank`` (or an int made from
    it) whose answer differs between the ranks (:data:`RANK_SPLIT`), like
    numpy's "truth value of an array is ambiguous". ``answers``: each rank's.

    NB: not a ``ValueError`` (numpy's is): ``except ValueError`` or
    ``assertRaises(ValueError)`` around code that branches on the rank took it
    for the error one rank would raise, and the test passed."""

    def __init__(self, what: str, answers: Mapping[int, Any]) -> None:
        # Ranks that answered alike together, in the order of their first
        # rank: the one rank that differs is shown whatever its number.
        alike: dict[str, list[int]] = {}
        for r in sorted(answers):
            alike.setdefault(repr(answers[r]), []).append(r)
        shown = "; ".join(f"{'rank' if len(ranks) == 1 else 'ranks'} {rank_runs(ranks)}: {answer}"
                          for answer, ranks in list(alike.items())[:SHOWN_RANKS])
        more = f"; ... {len(alike)} answers among {len(answers)} ranks" if len(alike) > SHOWN_RANKS else ""
        super().__init__(RANK_SPLIT.format(what=what, answers=shown + more))
        self.answers = dict(answers)


_RANK_NODE: list[type] = []
_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITHMETIC = ("neg", "add", "sub", "mul", "floordiv", "mod", "int_floordiv", "sym_max", "sym_min", "sym_sum")
#: Per-rank int operations torch's per-rank int lacks (its SymInt asked for them: an AttributeError).
_MORE_ARITHMETIC: dict[str, Callable[..., int]] = {
    "pow_by_natural": operator.pow, "lshift": operator.lshift, "rshift": operator.rshift,
    "bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor,
}
#: Those whose answer is a float (how a message names each).
_NOT_INT = {"int_truediv": "/", "truediv": "/", "float_truediv": "/", "float_pow": "** by a negative number",
            "pow": "**", "sym_float": "float(), or ** by a negative number,",
            "guard_float": "float()"}


def _rank_node() -> type:
    """torch's per-rank int (``LocalIntNode``) for ``self.rank``: arithmetic
    on it gives another such int; a comparison answers for every rank at
    once where they agree, and raises :class:`RankSplit` where they do not
    (torch's answered ``==`` and ``!=`` for all ranks, vacuously, and
    ``<`` with a bare AssertionError); ``int()`` and indexing raise it too.
    Only ``self.rank`` is made of it: torch's own per-rank ints (shapes of
    uneven shards) keep torch's answers."""
    if _RANK_NODE:
        return _RANK_NODE[0]
    base = _compat.local_tensor().LocalIntNode

    def compare(name: str) -> Callable[..., Any]:
        def method(self: Any, other: Any) -> Any:
            theirs, shown = _other_ints(other)
            answers = {r: bool(getattr(int, f"__{name}__")(v, theirs(r))) for r, v in self._local_ints.items()}
            if len(set(answers.values())) > 1:
                raise RankSplit(f"a per-rank int {_COMPARISONS[name]} {shown} (self.rank, or an int "
                                "made from it)", answers)
            return getattr(base, name)(self, other)
        return method

    def keep(name: str) -> Callable[..., Any]:
        def method(self: Any, *args: Any) -> Any:
            result = getattr(base, name)(self, *args)
            return type(self)(result._local_ints) if type(result) is base else result
        return method

    def more(op: Callable[..., int]) -> Callable[..., Any]:
        def method(self: Any, *args: Any) -> Any:
            theirs = _other_ints(args[0])[0] if args else None
            return type(self)({r: op(v, theirs(r)) if theirs else op(v) for r, v in self._local_ints.items()})
        return method

    def not_int(name: str) -> Callable[..., Any]:
        def method(self: Any, *args: Any) -> Any:
            raise TypeError(RANK_NOT_INT.format(op=_NOT_INT[name]))
        return method

    def int_(self: Any, *args: Any) -> int:  # (also guard_int(file, line): torch.tensor(self.rank))
        raise RankSplit("int() of a per-rank int, or an index made of it (self.rank, or an int made from it),",
                        self._local_ints)

    namespace: dict[str, Any] = {name: compare(name) for name in _COMPARISONS}
    namespace.update({name: keep(name) for name in _ARITHMETIC if hasattr(base, name)})
    namespace.update({name: more(op) for name, op in _MORE_ARITHMETIC.items()})
    # (math.floor, ceil and trunc of an int are the int: SymInt asked its node)
    namespace.update(abs=more(operator.abs), pos=more(operator.pos), floor=more(operator.pos),
                     ceil=more(operator.pos), trunc=more(operator.pos))
    namespace.update({name: not_int(name) for name in _NOT_INT})
    def wrap_int(self: Any, value: int) -> Any:
        # The int on the other side of ``10 // self.rank``, as a per-rank
        # int of one value (torch's constant node has none of the methods
        # the reflected operation asks it for).
        node = object.__new__(type(self))  # (past LocalIntNode.__new__, which makes a constant of it)
        node.__init__(dict.fromkeys(self._local_ints, value))
        return node

    namespace.update(int_=int_, guard_int=int_, wrap_int=wrap_int, __module__=__name__,
                     __doc__="``self.rank`` of a simulated test (see _rank_node).")
    _RANK_NODE.append(type("RankIntNode", (base,), namespace))
    return _RANK_NODE[0]


def _answers_split(answers: dict[int, Any]) -> RankSplit:
    """A Python value torch made of per-rank tensors whose ranks disagree."""
    return RankSplit("a Python value made of per-rank tensors (torch.equal, torch.allclose, bool() or .item() "
                     "of a tensor)", answers)


def _per_rank_int(values: dict[int, int]) -> Any:
    """``.item()`` of a per-rank int tensor: a per-rank int as ``self.rank`` is."""
    return torch.SymInt(_rank_node()(values))  # type: ignore[no-untyped-call]  # torch: unannotated


def _other_ints(other: Any) -> tuple[Callable[[int], int], str]:
    """The other side of a comparison (a per-rank int's node, a constant's,
    an int): its value on a rank, and how a message names it."""
    node = getattr(other, "node", other)
    values = getattr(node, "_local_ints", None)
    if values is not None and len(set(values.values())) > 1:
        return (lambda rank: int(values[rank])), "a per-rank int"
    if values is not None:  # (a constant, as wrap_int makes it)
        value = int(next(iter(values.values())))
        return (lambda rank: value), repr(value)
    value = int(node.maybe_as_int()) if hasattr(node, "maybe_as_int") else int(other)
    return (lambda rank: value), repr(value)
