"""What a file holds, as the rewrite (:mod:`._rewrite`) needs to know it:
the dotted name of an import, the upstream module it names, where disttest
keeps a name (asked of the installed disttest through :func:`module_names`),
how the file uses each module it binds, the names it never binds (what a
star gives it), the RPC suites it keeps from upstream, and whether it names
torch's testing modules at all.
"""

from __future__ import annotations

import ast
import dataclasses
import types
from collections.abc import Sequence
from typing import Protocol

import libcst as cst
import libcst.matchers as m

from disttest.migrate._homes import FALLBACK, HOMES, ONLY, PREFIX, RPC_FIXTURES, RPC_SUITES

__unittest = True

__all__ = ["RPC_FIXTURE_KEPT", "Lookup", "Names", "module_names"]

class Lookup(Protocol):
    """Whether disttest's module ``home`` offers ``name`` (``"*"``: whether
    the home exists); with ``star``, whether ``from home import *`` binds it
    (the module's ``__all__``, which a name the module only imports is not in)."""

    def __call__(self, home: str, name: str, star: bool = False) -> bool: ...


def _dotted(node: cst.BaseExpression | None) -> str:
    if node is None:
        return ""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        left = _dotted(node.value)
        return f"{left}.{node.attr.value}" if left else ""
    return ""


def _upstream(module: str) -> str | None:
    """``common_distributed`` for ``torch.testing._internal.common_distributed``."""
    if module.startswith(PREFIX + "."):
        return module[len(PREFIX) + 1:]
    return None


def _home_for(upstream: str, name: str, offers: Lookup) -> str | None:
    only = ONLY.get(upstream)
    if only is not None and name not in only:
        return None
    if only is None and upstream not in HOMES and not upstream.startswith("distributed."):
        return None  # a module of upstream's general framework (common_device_type's TestCase is not ours)
    first = HOMES.get(upstream)
    homes = [first] if first else []
    homes += [h for h in FALLBACK if h not in homes]
    return next((h for h in homes if offers(h, name)), None)


class _Attributes(cst.CSTVisitor):
    """How the file uses each name: the attributes it reads (``m.X`` ->
    ``{"m": {"X"}}``), assigns (``m.X = 1``), and the names it uses whole
    (passed, returned, patched: anything but ``name.attr``)."""

    def __init__(self) -> None:
        self.read: dict[str, set[str]] = {}
        self.written: dict[str, set[str]] = {}
        self.bare: set[str] = set()
        #: The nodes (ids) that hold a string literal naming an upstream module.
        self.holding_strings: set[int] = set()
        self._bases: set[int] = set()  # the Name nodes that are some attribute's base
        self._path: list[int] = []  # the nodes from the module down to the current one

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._path.append(id(node))
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._path.pop()
        super().on_leave(original_node)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if PREFIX in node.value:
            self.holding_strings.update(self._path)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        # The literal parts joined, as the rewriter reads them.
        if PREFIX in "".join(p.value for p in node.parts if isinstance(p, cst.FormattedStringText)):
            self.holding_strings.update(self._path)

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # the names an import binds are not uses

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if _dotted(node).startswith(PREFIX + "."):  # (a read the rewriter notes: it walks there)
            self.holding_strings.update(self._path)
        if isinstance(node.value, cst.Name):
            self._bases.add(id(node.value))
            self.read.setdefault(node.value.value, set()).add(node.attr.value)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._bases:
            self.bare.add(node.value)

    def _assigned(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
            self.written.setdefault(target.value.value, set()).add(target.attr.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._assigned(element.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._assigned(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._assigned(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assigned(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._assigned(node.target)


@dataclasses.dataclass(frozen=True)
class Names:
    """What a star import needs to know of the file: the names it uses and
    never binds (what a star gives it), and the line where each module-level
    name is first bound (a star below it would rebind it)."""

    unbound: frozenset[str]
    first_bound: dict[str, int]


def _names(tree: cst.Module) -> Names:
    wrapper = cst.metadata.MetadataWrapper(tree, unsafe_skip_copy=True)
    scopes = {s for s in wrapper.resolve(cst.metadata.ScopeProvider).values() if s is not None}
    positions = wrapper.resolve(cst.metadata.PositionProvider)
    unbound: set[str] = set()
    first: dict[str, int] = {}
    for scope in scopes:
        for access in scope.accesses:
            name = getattr(access.node, "value", None)
            if isinstance(name, str) and not access.referents and name not in scope.globals:
                unbound.add(name)
        if isinstance(scope, cst.metadata.GlobalScope):
            for assignment in scope.assignments:
                where = positions.get(getattr(assignment, "node", None))  # type: ignore[arg-type]
                if where is not None:
                    first[assignment.name] = min(first.get(assignment.name, where.start.line), where.start.line)
    return Names(frozenset(unbound), first)


#: Why an RPC fixture disttest offers stays upstream's.
RPC_FIXTURE_KEPT = ("the file keeps upstream's RPC suites ({suites}), which derive from upstream's fixture; "
                    "with disttest's the classes would stay abstract and no test would run")


def _rpc_suites(tree: cst.Module, source: str | bytes, offers: Lookup) -> list[str]:
    """The names the file keeps from upstream's RPC suite modules (sorted)."""
    if b"rpc" not in (source.encode("utf-8", "replace") if isinstance(source, str) else source):
        return []
    kept = set()
    for stmt in m.findall(tree, m.Import() | m.ImportFrom()):
        if isinstance(stmt, cst.Import):  # import <suite module> (as x)
            kept |= {_dotted(a.name) for a in stmt.names if _is_rpc_suite(_upstream(_dotted(a.name)))}
            continue
        if not isinstance(stmt, cst.ImportFrom) or stmt.relative:
            continue
        upstream = _upstream(_dotted(stmt.module))
        if upstream is None and _dotted(stmt.module) == PREFIX:
            upstream = ""
        if upstream is None:
            continue
        if isinstance(stmt.names, cst.ImportStar):
            if _is_rpc_suite(upstream):
                kept.add(f"{upstream}.*")
            continue
        for alias in stmt.names:
            name = _dotted(alias.name)
            if _is_rpc_suite(upstream):
                if _home_for(upstream, name, offers) is None:
                    kept.add(name)
            elif upstream not in RPC_FIXTURES and _is_rpc_suite(f"{upstream}.{name}".lstrip(".")):
                kept.add(f"{upstream}.{name}".lstrip("."))  # a package's module: from ...distributed.rpc import rpc_test
    return sorted(kept)


def _is_rpc_suite(upstream: str | None) -> bool:
    """Whether ``upstream`` (``distributed.rpc.rpc_test``) is a module of
    upstream's RPC suites (its fixtures are not)."""
    if upstream is None or upstream in RPC_FIXTURES:
        return False
    return any(upstream.startswith(s) if s.endswith(".") else upstream == s or upstream.startswith(s + ".")
               for s in RPC_SUITES)


def _nothing_upstream(source: str | bytes) -> bool:
    """Whether ``source`` names none of torch's testing modules (no
    ``_internal`` anywhere) and parses: the file needs no syntax tree (most
    of a suite's helpers; the tree costs about 2 ms a line). Anything else,
    or a file ``ast`` cannot read, goes to libcst, which names its errors."""
    if isinstance(source, bytes) and b"_internal" in source or isinstance(source, str) and "_internal" in source:
        return False
    try:
        text = source if isinstance(source, str) else source.decode("utf-8")
        ast.parse(text)
    except (SyntaxError, ValueError, UnicodeDecodeError):  # ValueError: a NUL byte
        return False
    return True


def module_names(modules: Sequence[str]) -> Lookup:
    """A lookup on the installed disttest: does ``home`` offer ``name``?"""
    import importlib

    cache: dict[str, object] = {}

    def offers(home: str, name: str, star: bool = False) -> bool:
        if home not in modules:
            return False
        if home not in cache:
            try:
                cache[home] = importlib.import_module(home)
            except ImportError:  # a home this disttest does not have
                cache[home] = None
        if name == "*":  # whether the home exists
            return cache[home] is not None
        try:
            found = getattr(cache[home], name, types)  # (a value that is never a name's)
        except Exception:  # noqa: BLE001 - a lazy name whose value failed (a bad DISTTEST_TIMEOUT): it exists
            return True
        # Not a submodule of disttest's (``disttest.fake`` is an old module path, not a name).
        if found is types or isinstance(found, types.ModuleType):
            return False
        if star:  # what ``import *`` binds: __all__ (every home has one), else the public names
            public = getattr(cache[home], "__all__", None)
            return name in public if public is not None else not name.startswith("_")
        return True

    return offers
