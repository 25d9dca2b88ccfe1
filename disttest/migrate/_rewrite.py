"""Rewrite one module's imports of torch's private testing modules to disttest.

A pure function of the source text and a name lookup (:func:`rewrite`), so
it is tested on strings. libcst keeps everything else of the file as it was
(comments, formatting, the order of statements).

Rules, for ``from torch.testing._internal.<module> import <names>``:

- each name that disttest offers (:data:`HOMES` names the disttest module to
  look in first; ``disttest`` itself comes next) moves to a ``from <home>
  import`` statement in place of the original, one per home, ``as`` aliases
  kept;
- a name disttest does not offer stays imported from torch, and the report
  names it (the suite still runs: it uses upstream's object there);
- ``import *`` moves when the module's home is known, else stays;
- ``import torch.testing._internal.<module> as m`` and ``from
  torch.testing._internal import <module>`` move to ``<home>`` when every
  attribute the file reads from ``m`` is offered there, else stay;
- anything else that names a private testing module (a string given to
  ``mock.patch``, a dotted attribute read) is reported, never changed.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from disttest.migrate._homes import FALLBACK, HOMES, ONLY, PREFIX

__unittest = True

__all__ = ["FALLBACK", "HOMES", "PREFIX", "Change", "Result", "module_names", "rewrite"]

#: (home module, name) -> whether the home offers the name ("*": whether the home exists).
Lookup = Callable[[str, str], bool]


@dataclasses.dataclass(frozen=True)
class Change:
    """One finding in a file: ``moved`` (to ``home``), ``kept`` (no disttest
    home, still imported from torch) or ``noted`` (left for a person)."""

    kind: str
    line: int
    upstream: str
    name: str
    home: str = ""

    def describe(self) -> str:
        if self.kind == "moved":
            return f"line {self.line}: {self.name} from {self.upstream} -> {self.home}"
        if self.kind == "kept":
            return (f"line {self.line}: {self.name} from {self.upstream} kept (disttest has no such name; "
                    f"upstream's is used)")
        return f"line {self.line}: {self.name} ({self.upstream}) left as it is: change it by hand"


@dataclasses.dataclass(frozen=True)
class Result:
    source: str
    changes: tuple[Change, ...]

    @property
    def changed(self) -> bool:
        return any(c.kind == "moved" for c in self.changes)


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
    first = HOMES.get(upstream)
    homes = [first] if first else []
    homes += [h for h in FALLBACK if h not in homes]
    return next((h for h in homes if offers(h, name)), None)


class _Attributes(cst.CSTVisitor):
    """The attributes the file reads from each name (``m.X`` -> ``{"m": {"X"}}``)."""

    def __init__(self) -> None:
        self.read: dict[str, set[str]] = {}
        self.bare: set[str] = set()  # names used other than as ``name.attr``

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name):
            self.read.setdefault(node.value.value, set()).add(node.attr.value)

    def visit_Name(self, node: cst.Name) -> None:
        self.bare.add(node.value)


class _Rewriter(m.MatcherDecoratableTransformer):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, offers: Lookup, attributes: _Attributes) -> None:
        super().__init__()
        self.offers = offers
        self.attributes = attributes
        self.changes: list[Change] = []

    def _line(self, node: cst.CSTNode) -> int:
        return int(self.get_metadata(cst.metadata.PositionProvider, node).start.line)

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine) -> cst.BaseStatement | cst.FlattenSentinel[
                                      cst.BaseStatement]:
        if len(updated.body) != 1:
            return updated
        stmt = updated.body[0]
        line = self._line(original)
        if isinstance(stmt, cst.ImportFrom):
            return self._from(stmt, updated, line)
        if isinstance(stmt, cst.Import):
            return self._import(stmt, updated, line)
        return updated

    def _from(self, stmt: cst.ImportFrom, updated: cst.SimpleStatementLine,
              line: int) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if stmt.relative:
            return updated
        module = _dotted(stmt.module)
        if module == PREFIX or self._imports_modules(stmt, module):  # from ... import <module>
            return self._module_names(stmt, updated, module, line)
        upstream = _upstream(module)
        if upstream is None:
            return updated
        if isinstance(stmt.names, cst.ImportStar):
            home = HOMES.get(upstream)
            if home is None or not self.offers(home, "*"):
                self.changes.append(Change("kept", line, upstream, "*"))
                return updated
            self.changes.append(Change("moved", line, upstream, "*", home))
            return updated.with_changes(body=[stmt.with_changes(module=cst.parse_expression(home))])
        by_home: dict[str, list[cst.ImportAlias]] = {}
        kept: list[cst.ImportAlias] = []
        for alias in stmt.names:
            name = _dotted(alias.name)
            home = _home_for(upstream, name, self.offers)
            if home is None:
                kept.append(alias)
                self.changes.append(Change("kept", line, upstream, name))
            else:
                by_home.setdefault(home, []).append(alias)
                self.changes.append(Change("moved", line, upstream, name, home))
        if not by_home:
            return updated
        statements: list[cst.BaseStatement] = []
        groups = [(h, names) for h, names in by_home.items()] + ([(module, kept)] if kept else [])
        for i, (home, names) in enumerate(groups):
            names = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in names]
            new = stmt.with_changes(module=cst.parse_expression(home), names=names, lpar=None, rpar=None)
            line_stmt = updated.with_changes(body=[new])
            if i:  # the comments above the original stay with the first
                line_stmt = line_stmt.with_changes(leading_lines=[])
            statements.append(line_stmt)
        return cst.FlattenSentinel(statements)

    @staticmethod
    def _imports_modules(stmt: cst.ImportFrom, module: str) -> bool:
        """``from torch.testing._internal.distributed import fake_pg``: names of modules."""
        parent = _upstream(module)
        return (parent is not None and not isinstance(stmt.names, cst.ImportStar)
                and any(f"{parent}.{_dotted(a.name)}" in HOMES for a in stmt.names))

    def _module_home(self, upstream: str, bound: str) -> str | None:
        """The home of a module bound to ``bound``, if every attribute read
        from it is offered there (and it is not used bare)."""
        home = HOMES.get(upstream)
        if home is None:
            return None
        read = self.attributes.read.get(bound, set())
        if all(_home_for(upstream, a, lambda h, n: h == home and self.offers(h, n)) for a in read):
            return home
        return None

    def _module_names(self, stmt: cst.ImportFrom, updated: cst.SimpleStatementLine, module: str,
                      line: int) -> cst.BaseStatement:
        if isinstance(stmt.names, cst.ImportStar) or len(stmt.names) != 1:
            for alias in [] if isinstance(stmt.names, cst.ImportStar) else stmt.names:
                self.changes.append(Change("noted", line, f"{module}.{_dotted(alias.name)}", "import"))
            return updated
        alias = stmt.names[0]
        name = _dotted(alias.name)
        upstream = (module[len(PREFIX) + 1:] + "." if module != PREFIX else "") + name
        bound = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
        home = self._module_home(upstream, bound)
        if home is None:
            self.changes.append(Change("kept", line, upstream, f"module {name}"))
            return updated
        parent, _, leaf = home.rpartition(".")
        self.changes.append(Change("moved", line, upstream, f"module {name}", home))
        new_alias = cst.ImportAlias(name=cst.Name(leaf), asname=cst.AsName(name=cst.Name(bound))
                                    if bound != leaf else None)
        if not parent:  # disttest itself: import disttest as <bound>
            return updated.with_changes(body=[cst.Import(names=[new_alias])])
        module_expr = cst.parse_expression(parent)
        assert isinstance(module_expr, (cst.Attribute, cst.Name))
        return updated.with_changes(body=[cst.ImportFrom(module=module_expr, names=[new_alias])])

    def _import(self, stmt: cst.Import, updated: cst.SimpleStatementLine, line: int) -> cst.BaseStatement:
        if len(stmt.names) != 1:
            for alias in stmt.names:
                if _upstream(_dotted(alias.name)):
                    self.changes.append(Change("noted", line, _dotted(alias.name), "import"))
            return updated
        alias = stmt.names[0]
        upstream = _upstream(_dotted(alias.name))
        if upstream is None:
            return updated
        if alias.asname is None:  # import torch.testing._internal.x: read through the dotted path
            self.changes.append(Change("noted", line, upstream, "import without as"))
            return updated
        bound = alias.asname.name.value  # type: ignore[union-attr]
        home = self._module_home(upstream, bound)
        if home is None:
            self.changes.append(Change("kept", line, upstream, f"module as {bound}"))
            return updated
        self.changes.append(Change("moved", line, upstream, f"module as {bound}", home))
        return updated.with_changes(body=[stmt.with_changes(
            names=[alias.with_changes(name=cst.parse_expression(home))])])

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if PREFIX in node.value:
            self.changes.append(Change("noted", self._line(node), node.value.strip("'\"rbuf"), "string"))


def rewrite(source: str, offers: Lookup) -> Result:
    """``source`` with its imports of torch's testing modules moved to
    disttest where ``offers(home, name)`` says disttest has the name."""
    tree = cst.parse_module(source)
    attributes = _Attributes()
    tree.visit(attributes)
    rewriter = _Rewriter(offers, attributes)
    new = cst.metadata.MetadataWrapper(tree).visit(rewriter)
    return Result(new.code, tuple(sorted(rewriter.changes, key=lambda c: c.line)))


def module_names(modules: Sequence[str]) -> Lookup:
    """A lookup on the installed disttest: does ``home`` offer ``name``?"""
    import importlib

    cache: dict[str, object] = {}

    def offers(home: str, name: str) -> bool:
        if home not in modules:
            return False
        if home not in cache:
            try:
                cache[home] = importlib.import_module(home)
            except ImportError:  # a home this disttest does not have
                cache[home] = None
        if name == "*":  # whether the home exists
            return cache[home] is not None
        found = getattr(cache[home], name, types)  # (a value that is never a name's)
        # Not a submodule of disttest's (``disttest.fake`` is an old module path, not a name).
        return found is not types and not isinstance(found, types.ModuleType)

    return offers
