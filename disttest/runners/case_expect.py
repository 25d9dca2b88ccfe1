"""Upstream ``common_utils.TestCase``'s expected-output assertions:
``assertExpected`` (a file beside the test's module, written under
expecttest's accept mode), ``assertExpectedInline`` without ANSI escapes,
``assertExpectedRaises``, ``assertExpectedInlineMunged`` and the text
helpers they use, with upstream's semantics and messages. A mixin of
:class:`~disttest.runners.case_parity.CaseParityMixin`; it runs in the
process or thread that calls it.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import expecttest

from disttest.runners.case_guards import munge_exc

__unittest = True

__all__ = ["DID_NOT_RAISE", "NO_EXPECT_FILE", "STRINGS_ONLY", "ExpectedOutputMixin"]

#: Upstream's messages, word for word.
DID_NOT_RAISE = "Did not raise when expected to"
STRINGS_ONLY = "assertExpected is strings only"
NO_EXPECT_FILE = (
    "I got this output for {test}{subname}:\n\n{output}\n\n"
    "No expect file exists; to accept the current output, run:\npython {main} {test} --accept"
)

_IS_WINDOWS = sys.platform == "win32"
_ANSI_ESCAPE = re.compile(r"""
    \x1B  # ESC
    (?:   # 7-bit C1 Fe (except CSI)
        [@-Z\\-_]
    |     # or [ for CSI, followed by a control sequence
        \[
        [0-?]*  # Parameter bytes
        [ -/]*  # Intermediate bytes
        [@-~]   # Final byte
    )
""", re.VERBOSE)


if TYPE_CHECKING:
    _Base = expecttest.TestCase
else:
    _Base = object


def _another_rank_accepts(case: Any) -> bool:
    """Under ``EXPECTTEST_ACCEPT=1``, in a rank process other than rank 0:
    rank 0 rewrites the test's file. Every rank rewrote it, and each after
    the first failed ("Failed to substitute string": its own copy of the
    source still held the old text); rank threads share one process, whose
    expecttest sees the first rewrite. A rank whose output differs from
    rank 0's fails on the next run, without the variable."""
    from disttest._runner import rank as rank_mod

    rank = getattr(case, "rank", 0)
    return isinstance(rank, int) and rank > 0 and rank_mod.current() is not None


class ExpectedOutputMixin(_Base):
    """The ``assertExpected*`` family of upstream's ``TestCase`` (before
    ``expecttest.TestCase`` in the class's order: it calls expecttest's
    ``assertExpectedInline``)."""

    def _remove_ansi_escape(self, input: str) -> str:
        return _ANSI_ESCAPE.sub("", input)

    def remove_comment_lines(self, input_string: str) -> str:
        """``input_string`` without the lines that start with ``#`` (after spaces)."""
        return "\n".join(line for line in input_string.split("\n") if not line.strip().startswith("#"))

    def remove_empty_lines(self, input_string: str) -> str:
        """``input_string`` without its blank lines."""
        return "\n".join(line for line in input_string.split("\n") if line.strip() != "")

    def assertExpectedInline(self, actual: Any, expect: str, skip: int = 0, ignore_comments: bool = False,
                             ignore_empty_lines: bool = False) -> None:
        """expecttest's ``assertExpectedInline`` on ``str(actual)``, both
        sides without ANSI escapes, and optionally without comment lines or
        blank lines. Under ``EXPECTTEST_ACCEPT=1`` rank 0 of rank processes
        rewrites the file; the other ranks' outputs are checked on the next
        run."""
        actual = self._remove_ansi_escape(actual if isinstance(actual, str) else str(actual))
        expect = self._remove_ansi_escape(expect)
        if ignore_comments:
            actual, expect = self.remove_comment_lines(actual), self.remove_comment_lines(expect)
        if ignore_empty_lines:
            actual, expect = self.remove_empty_lines(actual), self.remove_empty_lines(expect)
        if os.getenv("EXPECTTEST_ACCEPT") and _another_rank_accepts(self):
            return
        super().assertExpectedInline(actual, expect, skip + 1)

    def assertExpectedInlineMunged(self, exc_type: type[BaseException], callable: Callable[[], Any], expect: str, *,
                                   skip: int = 0, suppress_suffix: bool = True,
                                   post_munge: Callable[[str], str] | None = None) -> None:
        """:meth:`assertExpectedInline` on the :func:`munge_exc` text of the
        ``exc_type`` that ``callable()`` raises; fails if it raises none."""
        try:
            callable()
        except exc_type as e:
            munged = munge_exc(e, suppress_suffix=suppress_suffix, skip=skip + 1)
            if post_munge:
                munged = post_munge(munged)
            self.assertExpectedInline(munged, expect, skip=skip + 1)
            return
        self.fail(msg=DID_NOT_RAISE)

    def assertExpected(self, s: str, subname: str | None = None) -> None:
        """Fail unless ``s`` equals the file ``expect/<test id>[-subname].expect``
        beside the test's module; with expecttest's accept mode (``--accept``
        or ``EXPECTTEST_ACCEPT=1``), write it instead."""
        if not isinstance(s, str):
            raise TypeError(STRINGS_ONLY)
        module_id = self.__class__.__module__
        test_id = self.id().removeprefix(module_id + ".")
        test_file = os.path.realpath(str(sys.modules[module_id].__file__))
        expected_file = os.path.join(os.path.dirname(test_file), "expect", test_id)
        subname_output = ""
        if subname:
            expected_file += "-" + subname
            subname_output = f" ({subname})"
        expected_file += ".expect"

        def accept_output(update_type: str) -> None:
            print(f"Accepting {update_type} for {test_id}{subname_output}:\n\n{s}")
            with open(expected_file, "w") as f:
                f.write(re.sub(r'(producer_version): "[0-9.]*"', r'\1: "CURRENT_VERSION"', s))

        try:
            with open(expected_file) as f:
                expected = f.read()
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
            if expecttest.ACCEPT:
                return accept_output("output")
            main = getattr(sys.modules["__main__"], "__file__", "<main>")
            raise RuntimeError(NO_EXPECT_FILE.format(test=test_id, subname=subname_output, output=s,
                                                     main=main)) from None
        if _IS_WINDOWS:  # a hack for JIT tests, as upstream
            expected = re.sub(r"CppOp\[(.+?)\]", "CppOp[]", expected)
            s = re.sub(r"CppOp\[(.+?)\]", "CppOp[]", s)
        if 'producer_version: "CURRENT_VERSION"' in expected:
            import torch.onnx

            expected = expected.replace('producer_version: "CURRENT_VERSION"',
                                        f'producer_version: "{torch.onnx.producer_version}"')
        if expecttest.ACCEPT:
            if expected != s:
                return accept_output("updated output")
        else:
            self.assertMultiLineEqual(expected, s)

    def assertExpectedStripMangled(self, s: str, subname: str | None = None) -> None:
        """:meth:`assertExpected` with TorchScript's ``__torch__...`` names removed."""
        self.assertExpected(re.sub(r"__torch__[^ ]+", "", s), subname)

    def assertExpectedRaises(self, exc_type: type[BaseException], callable: Callable[..., Any], *args: Any,
                             **kwargs: Any) -> None:
        """:meth:`assertExpected` on the message of the ``exc_type`` that
        ``callable(*args, **kwargs)`` raises (``subname`` is taken from kwargs)."""
        subname = kwargs.pop("subname", None)
        try:
            callable(*args, **kwargs)
        except exc_type as e:
            self.assertExpected(str(e), subname)
            return
        self.fail(msg=DID_NOT_RAISE)
