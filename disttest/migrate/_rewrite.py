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
import functools
from collections.abc import Callable, Container, Sequence
from typing import Any

import libcst as cst
import libcst.matchers as m

from disttest.migrate._homes import FALLBACK, HOMES, ONLY, PREFIX, RPC_FIXTURES
from disttest.migrate._survey import (
    RPC_FIXTURE_KEPT,
    Lookup,
    Names,
    _Attributes,
    _dotted,
    _home_for,
    _names,
    _nothing_upstream,
    _rpc_suites,
    _upstream,
    module_names,
)

__unittest = True

__all__ = ["FALLBACK", "HOMES", "PREFIX", "Change", "Result", "module_names", "rewrite"]



@dataclasses.dataclass(frozen=True)
class Change:
    """One finding in a file: ``moved`` (to ``home``), ``kept`` (no disttest
    home, still imported from torch), ``added`` (a line the import did the
    work of) or ``noted`` (left for a person);
    ``why``: the reason a name was kept or noted."""

    kind: str
    line: int
    upstream: str
    name: str
    home: str = ""
    why: str = ""

    def describe(self) -> str:
        """What a person reads after ``file:line:``."""
        if self.kind == "moved":
            return f"{self.name} from {self.upstream} -> {self.home}"
        if self.kind == "added":
            return f"{self.name} added after it ({self.why})"
        if self.kind == "kept":
            return (f"{self.name} from {self.upstream} kept ({self.why or 'disttest has no such name'}; "
                    f"upstream's is used)")
        return f"{self.name} ({self.upstream}) left as it is: change it by hand" + (f" ({self.why})" if self.why else "")


@dataclasses.dataclass(frozen=True)
class Result:
    """The rewritten file: ``source`` (text), ``data`` (its bytes, in the
    file's own encoding, BOM and line endings) and what was found."""

    source: str
    changes: tuple[Change, ...]
    data: bytes = b""
    encoding: str = "utf-8"

    @property
    def changed(self) -> bool:
        return any(c.kind == "moved" for c in self.changes)


#: Upstream modules whose import registers a c10d backend as it runs, which
#: disttest does only inside its ranks (never at import).
REGISTERS = {
    "distributed.distributed_utils": ("mock_process_group", "use disttest.mock_init_dist or with_dist"),
}
#: Of those, the ones whose registration the file is given where its import
#: of the module was (the file registered it there before): the backend and
#: the disttest function that registers it.
REGISTERED_HERE = {
    "distributed.fake_pg": ("fake", "register_fake_backend"),
}
#: The comment on the import of that function.
REGISTERED_WHY = "importing upstream's {module} registered the {backend!r} backend (disttest.migrate)"


#: The nodes that hold statements (the walk goes on into them): the module,
#: compound statements and their blocks. (A simple statement line and a
#: one-line suite are handled whole when left.)
_STATEMENT_CONTAINERS = (cst.Module, cst.BaseCompoundStatement, cst.IndentedBlock, cst.Else,
                         cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.MatchCase)


@dataclasses.dataclass
class _Block:
    """A block of statements the rewriter is in: ``module``, ``class`` (a
    class body), ``function``, ``typing`` (``if TYPE_CHECKING:``) or
    ``block``; whether it is under ``if TYPE_CHECKING:`` or in a class body,
    and the modules whose registration it was given."""

    kind: str
    typing: bool = False
    #: A class body, or a block in one (``try:``, ``if``...), not a function's.
    in_class: bool = False
    registered: set[str] = dataclasses.field(default_factory=set)


class _Rewriter(m.MatcherDecoratableTransformer):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, offers: Lookup, attributes: _Attributes, scope_names: Callable[[], Names],
                 rpc_suites: Sequence[str] = (), names: Container[str] = ()) -> None:
        super().__init__()
        self.offers = offers
        self.attributes = attributes
        self._scope_names = scope_names
        #: Upstream RPC suites the file keeps: its fixtures stay upstream's too.
        self.rpc_suites = rpc_suites
        self.changes: list[Change] = []
        #: The names the file's text holds (a name an added line binds must not be one of them).
        self._names = names
        self._blocks = [_Block("module")]
        self._kinds: dict[int, str] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Imports are statements: below a simple statement line, or in a
        # compound statement's header, there are none, and rebuilding those
        # nodes is most of the run. Only strings that name upstream's
        # modules (noted) need the walk to go on into expressions.
        if not isinstance(node, _STATEMENT_CONTAINERS) and id(node) not in self.attributes.holding_strings:
            return False
        return super().on_visit(node)

    def _line(self, node: cst.CSTNode) -> int:
        return int(self.get_metadata(cst.metadata.PositionProvider, node).start.line)

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine) -> cst.BaseStatement | cst.FlattenSentinel[
                                      cst.BaseStatement]:
        line = self._line(original)
        if len(updated.body) != 1:
            self._note_imports(updated.body, line, "one of several statements on a line")
            return updated
        stmt = updated.body[0]
        before = len(self.changes)
        if isinstance(stmt, cst.ImportFrom):
            return self._registered(self._from(stmt, updated, line), self.changes[before:])
        if isinstance(stmt, cst.Import):
            return self._registered(self._import(stmt, updated, line), self.changes[before:])
        return updated

    def leave_SimpleStatementSuite(self, original: cst.SimpleStatementSuite,
                                   updated: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
        # ``if x: from ... import y``: noted, never rewritten in place.
        self._note_imports(updated.body, self._line(original), "on the line of its block's header")
        return updated

    def _note_imports(self, body: Sequence[cst.BaseSmallStatement], line: int, why: str) -> None:
        for stmt in body:
            if isinstance(stmt, cst.ImportFrom) and not stmt.relative and _upstream(_dotted(stmt.module)):
                self.changes.append(Change("noted", line, _dotted(stmt.module), "import", why=why))
            elif isinstance(stmt, cst.Import):
                for alias in stmt.names:
                    if _upstream(_dotted(alias.name)):
                        self.changes.append(Change("noted", line, _dotted(alias.name), "import", why=why))

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
        self._note_registration(upstream, line)
        if isinstance(stmt.names, cst.ImportStar):
            return self._star(stmt, updated, upstream, line)
        by_home: dict[str, list[cst.ImportAlias]] = {}
        kept: list[cst.ImportAlias] = []
        for alias in stmt.names:
            name = _dotted(alias.name)
            fixture = upstream in RPC_FIXTURES and bool(self.rpc_suites)
            home = None if fixture else _home_for(upstream, name, self.offers)
            if home is None:
                kept.append(alias)
                why = "" if upstream not in ONLY else "disttest moves only the distributed names of this module"
                if fixture:
                    why = RPC_FIXTURE_KEPT.format(suites=", ".join(self.rpc_suites))
                self.changes.append(Change("kept", line, upstream, name, why=why))
            else:
                by_home.setdefault(home, []).append(alias)
                self.changes.append(Change("moved", line, upstream, name, home))
        if not by_home:
            return updated
        if len(by_home) == 1 and not kept:  # one home: only the module changes, every byte else stays
            (home,) = by_home
            return updated.with_changes(body=[stmt.with_changes(module=cst.parse_expression(home))])
        statements: list[cst.BaseStatement] = []
        groups = [(h, names) for h, names in by_home.items()] + ([(module, kept)] if kept else [])
        comments = _alias_comments(stmt)
        # A parenthesised import over several lines keeps that layout (and its comments).
        multiline = stmt.lpar is not None and "\n" in cst.Module([]).code_for_node(stmt)
        for i, (home, names) in enumerate(groups):
            if multiline:  # one name a line, each with its comments
                new: cst.BaseSmallStatement = _parenthesised(home, [(a, *comments[id(a)]) for a in names])
            else:
                names = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in names]
                new = stmt.with_changes(module=cst.parse_expression(home), names=names, lpar=None, rpar=None)
            line_stmt = updated.with_changes(body=[new], trailing_whitespace=_trailing(updated, i, 0))
            if i:  # the comments above the original stay with the first
                line_stmt = line_stmt.with_changes(leading_lines=[])
            statements.append(line_stmt)
        return cst.FlattenSentinel(statements)

    def _star(self, stmt: cst.ImportFrom, updated: cst.SimpleStatementLine, upstream: str,
              line: int) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        home = HOMES.get(upstream)
        if home is None or not self.offers(home, "*"):
            self.changes.append(Change("kept", line, upstream, "*", why="no disttest module stands for it"))
            return self._kept_star(updated, upstream, line)
        # Upstream's modules have no __all__: their star gives everything they
        # hold (TEST_WITH_ROCM, os, torch...); the home's gives its __all__.
        # Moved when every name the file uses from it is in the home's star
        # or imported after it from where disttest keeps it (common_dtensor's
        # star holds skip_if_lt_x_gpu; disttest.bases.dtensor's does not).
        names = self._scope_names()
        lacking = sorted(n for n in names.unbound if not self.offers(home, n, star=True))
        public = functools.partial(self.offers, star=True)
        elsewhere = {n: _home_for(upstream, n, public) for n in lacking}
        missing = [n for n, h in elsewhere.items() if h is None]
        if missing:
            shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
            self.changes.append(Change("kept", line, upstream, "*", why=f"the file uses {shown}, which {home} "
                                       "lacks; import the names it uses one by one"))
            return self._kept_star(updated, upstream, line)
        # A name the file binds above the star (its own, or one an import
        # kept from upstream), which the home's star would rebind.
        moved_above = {c.name for c in self.changes if c.kind == "moved" and c.line < line}
        rebound = sorted(n for n, first in names.first_bound.items()
                         if first < line and n not in moved_above and self.offers(home, n, star=True))
        if rebound:
            shown = ", ".join(rebound[:3]) + (" ..." if len(rebound) > 3 else "")
            self.changes.append(Change("kept", line, upstream, "*", why=f"{home}'s would rebind {shown}, which the "
                                       "file binds above it; import the names it uses one by one"))
            return updated
        self.changes.append(Change("moved", line, upstream, "*", home))
        statements: list[cst.BaseStatement] = [updated.with_changes(body=[stmt.with_changes(module=cst.parse_expression(home))])]
        by_home: dict[str, list[str]] = {}
        for n, h in elsewhere.items():
            assert h is not None
            by_home.setdefault(h, []).append(n)
            self.changes.append(Change("moved", line, upstream, n, h))
        for h, found in by_home.items():  # (sorted: ``lacking`` is)
            statements.append(cst.parse_statement(f"from {h} import {', '.join(found)}\n"))
        return statements[0] if len(statements) == 1 else cst.FlattenSentinel(statements)

    def _kept_star(self, updated: cst.SimpleStatementLine, upstream: str, line: int) -> cst.SimpleStatementLine:
        """A star import kept from upstream rebinds the names an earlier
        import moved from that module to disttest, and maybe others (an
        upstream module holds what it imports: ``common_distributed`` holds
        ``TestCase`` and ``find_free_port`` from ``common_utils``): upstream's
        are used, and the report said disttest's (noted, for a person to
        change)."""
        same = {c.name for c in self.changes
                if c.kind == "moved" and c.upstream == upstream and c.name != "*" and c.line < line}
        other = {c.name for c in self.changes
                 if c.kind == "moved" and c.upstream != upstream and "." not in c.name and " " not in c.name
                 and c.name != "*" and c.line < line} - same
        for names, how in ((same, "rebinds"), (other, "may rebind")):
            if names:
                shown = ", ".join(sorted(names)[:3]) + (" ..." if len(names) > 3 else "")
                self.changes.append(Change("noted", line, upstream, "import *", why=(
                    f"it {how} {shown}, moved to disttest above it, to upstream's: import the names the file uses "
                    "one by one")))
        return updated

    def _note_registration(self, upstream: str, line: int) -> None:
        registers = REGISTERS.get(upstream)
        if registers is not None:
            backend, advice = registers
            self.changes.append(Change(
                "noted", line, upstream, f"the {backend!r} backend",
                why=f"importing upstream's module registered it, disttest registers it only in its ranks: "
                    f"where the file makes a {backend!r} group outside them, {advice}"))

    def _registered(self, result: cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement],
                    changes: Sequence[Change]) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        """``result`` (an import statement, rewritten as ``changes`` say),
        followed by the registration that importing a module of
        :data:`REGISTERED_HERE` did, where the statement no longer imports
        it (a ``fake`` group made in a script, ``setUpClass`` or a pytest
        function needs it): once a block, not where the import never ran
        (``if TYPE_CHECKING:``), and leaving no name in a class body."""
        for upstream in dict.fromkeys(c.upstream for c in changes if c.kind == "moved"):
            registers = REGISTERED_HERE.get(upstream)
            if registers is None or any(c.kind == "kept" and c.upstream == upstream for c in changes):
                continue  # (upstream's module is still imported: it still registers)
            block = self._blocks[-1]
            if block.typing or upstream in block.registered:
                continue
            block.registered.add(upstream)
            backend, function = registers
            why = REGISTERED_WHY.format(module=upstream.rpartition(".")[2], backend=backend)
            line = next(c.line for c in changes if c.upstream == upstream)
            self.changes.append(Change("added", line, upstream, f"{function}()", why=why))
            # The file's own name stays its own.
            name = function if function not in self._names else f"disttest_{function}"
            alias = "" if name == function else f" as {name}"
            added = [cst.parse_statement(f"from disttest import {function}{alias}  # {why}\n"),
                     cst.parse_statement(f"{name}()\n")]
            if block.in_class:  # (a name bound there is a class attribute: a method)
                added.append(cst.parse_statement(f"del {name}\n"))
            result = cst.FlattenSentinel([*(result if isinstance(result, cst.FlattenSentinel) else [result]), *added])
        return result

    # The blocks the walk is in (the module's first): where an import is.
    def visit_Module(self, node: cst.Module) -> None:
        self._blocks = [_Block("module")]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._kinds[id(node.body)] = "class"

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._kinds[id(node.body)] = "function"

    def visit_If(self, node: cst.If) -> None:
        test = node.test
        if (isinstance(test, cst.Name) and test.value == "TYPE_CHECKING"
                or isinstance(test, cst.Attribute) and test.attr.value == "TYPE_CHECKING"):
            self._kinds[id(node.body)] = "typing"

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        kind = self._kinds.pop(id(node), "block")
        outer = self._blocks[-1]
        self._blocks.append(_Block(kind, typing=kind == "typing" or outer.typing,
                                   in_class=kind == "class" or kind != "function" and outer.in_class))

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        self._blocks.pop()
        return updated

    @staticmethod
    def _imports_modules(stmt: cst.ImportFrom, module: str) -> bool:
        """``from torch.testing._internal.distributed import fake_pg``: names of modules."""
        parent = _upstream(module)
        return (parent is not None and not isinstance(stmt.names, cst.ImportStar)
                and any(f"{parent}.{_dotted(a.name)}" in HOMES for a in stmt.names))

    def _module_home(self, upstream: str, bound: str) -> tuple[str | None, str]:
        """(the home of a module bound to ``bound``, "") if the file only
        reads attributes of it that the home offers; else (None, why)."""
        home = HOMES.get(upstream)
        if home is None:
            return None, "no disttest module stands for it"
        if bound in self.attributes.bare:
            return None, f"{bound} is used as a whole, not only as {bound}.<name>"
        written = sorted(self.attributes.written.get(bound, ()))
        if written:
            return None, f"{bound}.{written[0]} is assigned, which would not set disttest's"
        for a in sorted(self.attributes.read.get(bound, ())):
            if not _home_for(upstream, a, lambda h, n, star=False: h == home and self.offers(h, n, star)):
                return None, f"{bound}.{a} is not in {home}"
        return home, ""

    def _module_names(self, stmt: cst.ImportFrom, updated: cst.SimpleStatementLine, module: str,
                      line: int) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if isinstance(stmt.names, cst.ImportStar):
            return updated
        if len(stmt.names) != 1:
            return self._each_module(stmt, updated, line, lambda s, u: self._module_names(s, u, module, line))
        if module != PREFIX and not self._imports_modules(stmt, module):
            # A name beside a module (``from ..sharded_tensor import ShardedTensorTestBase,
            # _test_st_common``): a name, moved as from-imported names are.
            return self._from(stmt, updated, line)
        alias = stmt.names[0]
        name = _dotted(alias.name)
        upstream = (module[len(PREFIX) + 1:] + "." if module != PREFIX else "") + name
        self._note_registration(upstream, line)
        bound = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
        home, why = self._module_home(upstream, bound)
        if home is None:
            self.changes.append(Change("kept", line, upstream, f"module {name}", why=why))
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

    def _import(self, stmt: cst.Import, updated: cst.SimpleStatementLine, line: int) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if len(stmt.names) != 1:
            return self._each_module(stmt, updated, line, lambda s, u: self._import(s, u, line))
        alias = stmt.names[0]
        upstream = _upstream(_dotted(alias.name))
        if upstream is None:
            return updated
        self._note_registration(upstream, line)
        if alias.asname is None:  # import torch.testing._internal.x: read through the dotted path
            self.changes.append(Change("noted", line, upstream, "import without as",
                                       why="the file reads it through torch's dotted path"))
            return updated
        bound = alias.asname.name.value  # type: ignore[union-attr]
        home, why = self._module_home(upstream, bound)
        if home is None:
            self.changes.append(Change("kept", line, upstream, f"module as {bound}", why=why))
            return updated
        self.changes.append(Change("moved", line, upstream, f"module as {bound}", home))
        return updated.with_changes(body=[stmt.with_changes(
            names=[alias.with_changes(name=cst.parse_expression(home))])])

    def _each_module(self, stmt: cst.Import | cst.ImportFrom, updated: cst.SimpleStatementLine, line: int,
                     one: Callable[[Any, cst.SimpleStatementLine], cst.BaseStatement | cst.FlattenSentinel[
                         cst.BaseStatement]]) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        """A statement that imports several modules (``import a as x, os``,
        ``from torch.testing._internal import common_distributed as cd,
        common_utils``) as one statement a module, each rewritten by ``one``
        as if alone; as it was where none of them moves. A statement with a
        comment inside its parentheses is only noted (a split would lose it)."""
        assert not isinstance(stmt.names, cst.ImportStar)
        names = list(stmt.names)
        if isinstance(stmt, cst.ImportFrom) and stmt.lpar is not None and "#" in cst.Module([]).code_for_node(stmt):
            for alias in names:
                self.changes.append(Change("noted", line, f"{_dotted(stmt.module)}.{_dotted(alias.name)}", "import",
                                           why="several modules in one statement, with a comment inside"))
            return updated
        kept = True
        results: list[cst.BaseStatement] = []
        for i, alias in enumerate(names):
            single = stmt.with_changes(names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)])
            if isinstance(single, cst.ImportFrom):
                single = single.with_changes(lpar=None, rpar=None)
            part = updated.with_changes(
                body=[single], leading_lines=updated.leading_lines if i == 0 else (),
                trailing_whitespace=_trailing(updated, i, len(names) - 1))
            done = one(single, part)
            kept = kept and done is part
            results += list(done) if isinstance(done, cst.FlattenSentinel) else [done]
        if kept:  # (none moves: the statement stays whole, byte for byte)
            return updated
        return cst.FlattenSentinel(results)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if PREFIX in node.value:
            self.changes.append(Change("noted", self._line(node), node.value.strip("'\"rbuf"), "string"))

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        dotted = _dotted(node)
        if dotted.startswith(PREFIX + "."):
            self.changes.append(Change("noted", self._line(node), dotted, "attribute read"))
            return False  # (the chain's inner attributes are the same read)
        return True

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        text = "".join(p.value for p in node.parts if isinstance(p, cst.FormattedStringText))
        if PREFIX in text:
            self.changes.append(Change("noted", self._line(node), text, "f-string"))


#: Comments that say something to a tool about their line: each line a split makes keeps them.
_DIRECTIVES = ("noqa", "type:", "pragma", "pylint:", "pyright:", "mypy:", "fmt:", "isort:", "nosec")


def _trailing(line: cst.SimpleStatementLine, i: int, keeper: int) -> cst.TrailingWhitespace:
    """The end of the ``i``-th line a statement line is split into: the
    ``keeper``-th keeps its comment; the others too where it is a tool's
    directive (``# noqa: F401`` applies to each), else they have none."""
    comment = line.trailing_whitespace.comment
    if i == keeper or comment is not None and comment.value.lstrip("#").strip().lower().startswith(_DIRECTIVES):
        return line.trailing_whitespace
    return cst.TrailingWhitespace()


def _alias_comments(stmt: cst.ImportFrom) -> dict[int, tuple[list[str], str]]:
    """For each name of a parenthesised import: (the comment lines above
    it, its trailing comment), read from the whitespace libcst keeps."""
    assert not isinstance(stmt.names, cst.ImportStar)
    names = list(stmt.names)
    found: dict[int, tuple[list[str], str]] = {}

    def lines(ws: object) -> tuple[str, list[str]]:
        if not isinstance(ws, cst.ParenthesizedWhitespace):
            return "", []
        trailing = ws.first_line.comment.value if ws.first_line.comment else ""
        return trailing, [e.comment.value for e in ws.empty_lines if e.comment]

    first, above = lines(stmt.lpar.whitespace_after if stmt.lpar is not None else None)
    above = ([first] if first else []) + above
    for i, alias in enumerate(names):
        after = alias.comma.whitespace_after if isinstance(alias.comma, cst.Comma) else None
        if after is None and i == len(names) - 1 and stmt.rpar is not None:
            after = stmt.rpar.whitespace_before  # the last name, without a comma: ``b  # c\n)``
        trailing, below = lines(after)
        found[id(alias)] = (above, trailing)
        above = below
    if above and names:  # comment lines before the closing parenthesis: with the last name
        last = found[id(names[-1])]
        found[id(names[-1])] = (last[0] + above, last[1])
    return found


def _parenthesised(home: str, names: Sequence[tuple[cst.ImportAlias, list[str], str]]) -> cst.BaseSmallStatement:
    """``from <home> import (`` one name a line, with its comments ``)``."""
    empty = cst.Module([])
    text = [f"from {home} import ("]
    for alias, above, trailing in names:
        text += [f"    {c}" for c in above]
        code = empty.code_for_node(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        text.append(f"    {code}," + (f"  {trailing}" if trailing else ""))
    text.append(")")
    parsed = cst.parse_statement("\n".join(text) + "\n")
    assert isinstance(parsed, cst.SimpleStatementLine)
    return parsed.body[0]


def rewrite(source: str | bytes, offers: Lookup) -> Result:
    """``source`` (text, or a file's bytes: its encoding, BOM and line
    endings are kept) with its imports of torch's testing modules moved to
    disttest where ``offers(home, name)`` says disttest has the name."""
    if _nothing_upstream(source):
        if isinstance(source, str):
            return Result(source, (), source.encode("utf-8"))
        return Result(source.decode("utf-8"), (), source)
    tree = cst.parse_module(source)
    attributes = _Attributes()
    tree.visit(attributes)
    scope_names = functools.cache(functools.partial(_names, tree))  # only for a star import: a scope analysis
    text = source if isinstance(source, str) else source.decode(tree.encoding, "replace")
    names = {f for _, f in REGISTERED_HERE.values() if f in text}
    rewriter = _Rewriter(offers, attributes, scope_names, _rpc_suites(tree, source, offers), names)
    # (no copy of the tree: nothing changes it, and a copy costs a fifth of the run)
    new = cst.metadata.MetadataWrapper(tree, unsafe_skip_copy=True).visit(rewriter)
    code, data = new.code, new.bytes
    # NB: libcst drops the last line ending of a file whose lines end in a
    # CR alone (its module has no trailing newline then): put it back.
    if (source.endswith(b"\r") if isinstance(source, bytes) else source.endswith("\r")) and not code.endswith("\r"):
        code += "\r"
        data += "\r".encode(new.encoding)
    return Result(code, tuple(sorted(rewriter.changes, key=lambda c: c.line)), data, new.encoding)
