"""A rank's traceback as data, and a real traceback rebuilt from it in the
parent, so that unittest and pytest show the user's lines.

The data is tblib's (``Traceback(tb).to_dict()``), each frame with one key
more, ``tb_positions``: the columns of the call that raised (Python 3.11's
carets). tblib rebuilds a frame by raising from a stub that stands on the
frame's line, and the stub's own columns drew carets under the wrong part
of the user's line; here the stub carries the frame's own columns, or none
(a frame read from a stack dump, which has no columns: no carets).
"""

from __future__ import annotations

import itertools
import sys
from types import CodeType, TracebackType
from typing import Any

__unittest = True

__all__ = ["POSITIONS", "Shown", "as_traceback", "positions"]

#: The key of a frame's columns in its data: (lineno, end_lineno, col, end_col).
POSITIONS = "tb_positions"
_NAME = "__disttest_traceback_maker"  # (undefined: loading it raises)
_stub: list[CodeType] = []


def positions(tb: TracebackType) -> tuple[int, int, int, int] | None:
    """The columns of the instruction ``tb`` stands on (Python 3.11 and
    later), as the interpreter reports them; None when it has none."""
    if sys.version_info < (3, 11) or tb.tb_lasti < 0:
        return None
    try:
        where = next(itertools.islice(tb.tb_frame.f_code.co_positions(), tb.tb_lasti // 2, None))
    except (StopIteration, ValueError):
        return None
    if any(p is None for p in where):
        return None
    return where  # type: ignore[return-value]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 64:
        out.append(0x40 | (value & 0x3F))
        value >>= 6
    out.append(value)
    return bytes(out)


def _svarint(value: int) -> bytes:
    return _varint(((-value) << 1) | 1 if value < 0 else value << 1)


def _linetable(units: int, where: tuple[int, int, int, int] | None) -> bytes:
    """A location table (CPython's ``Objects/locations.md``, 3.11 and later)
    that puts each of ``units`` code units on the first line, with the
    columns of ``where`` (a long-form entry) or none (no-column entries)."""
    table = bytearray()
    while units > 0:
        n = min(units, 8)
        units -= n
        if where is None:
            table.append(0x80 | (13 << 3) | (n - 1))
            table += _svarint(0)
        else:
            line, end_line, col, end_col = where
            table.append(0x80 | (14 << 3) | (n - 1))
            table += _svarint(0) + _varint(end_line - line) + _varint(col + 1) + _varint(end_col + 1)
    return bytes(table)


def _frame_code(node: dict[str, Any]) -> CodeType:
    if not _stub:
        _stub.append(compile(_NAME, "<disttest>", "exec"))
    code = node["tb_frame"]["f_code"]
    lineno = node["tb_lineno"]
    fields: dict[str, Any] = {"co_firstlineno": lineno, "co_filename": code["co_filename"], "co_name": code["co_name"]}
    if sys.version_info >= (3, 11):
        where = node.get(POSITIONS)
        if where is not None and where[0] != lineno:
            where = None  # (not this line's: no columns rather than wrong ones)
        fields["co_linetable"] = _linetable(len(_stub[0].co_code) // 2, where)
    return _stub[0].replace(**fields)


class Shown(str):
    """A local's text, shown as it is (a traceback shows each local's repr)."""

    def __repr__(self) -> str:
        return str(self)


def as_traceback(data: dict[str, Any]) -> TracebackType | None:
    """The traceback that ``data`` describes (outermost frame first), each
    frame standing on its line, with its columns where the data has them."""
    first: TracebackType | None = None
    last: TracebackType | None = None
    node: dict[str, Any] | None = data
    while node is not None:
        frame = node["tb_frame"]
        names = {k: v for k, v in frame.get("f_globals", {}).items() if k in ("__file__", "__name__")}
        try:
            # (its locals: the rank's, as text, where it sent them; else none,
            # not this stub's globals: unittest's --locals showed __builtins__)
            exec(_frame_code(node), names,  # noqa: S102 (a stub that raises on the frame's line)
                 {k: Shown(v) for k, v in (frame.get("f_locals") or {}).items()})
        except NameError as e:
            tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
            if tb is not None:
                if last is None:
                    first = tb
                else:
                    last.tb_next = tb
                last = tb
        node = node.get("tb_next")
    return first
