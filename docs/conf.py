"""Sphinx configuration of disttest's documentation (``make docs``).

The API reference is generated from the docstrings by autodoc, importing the
installed disttest and torch (nothing is mocked). The build runs with
warnings as errors.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

project = "disttest"
author = "disttest contributors"
copyright = "disttest contributors"  # noqa: A001  (Sphinx's name)

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build", "examples"]
# NB: a bare ``::`` block is not Python unless it says so; every Python
# example is a ``code-block:: python`` or a literalinclude that the tests run.
highlight_language = "none"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# NB: no values: several constants are computed on the building host
# (``disttest.dtensor.DEVICE_TYPE`` is "cpu" here, "cuda" on a GPU host).
autodoc_default_options = {"show-inheritance": True, "no-value": True}


html_theme = "furo"
html_title = "disttest"


def _drop_type_docstrings(app, what, name, obj, options, lines):
    """A data constant documents itself in the page, not by its type's docstring.

    autodoc falls back to ``type(obj).__doc__`` for a module-level value
    (``dict``'s docstring for ``TEST_SKIPS``, a model class's for ``DDP_NET``);
    that text says nothing about the constant.
    """
    if what == "data" and lines and _same("\n".join(lines), getattr(type(obj), "__doc__", None) or ""):
        lines.clear()


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def _reexported_data_comments(app, what, name, obj, options, lines):
    """A constant a package re-exports keeps the ``#:`` comment of the module that assigns it.

    autodoc reads ``#:`` comments in the module it documents only: the comment of
    ``disttest.conformance.CASES`` is in ``disttest.conformance.cases``. Runs after
    ``_drop_type_docstrings`` and napoleon, on what they left empty.
    """
    if what != "data" or lines:
        return
    from sphinx.errors import PycodeError
    from sphinx.pycode import ModuleAnalyzer

    package, _, attr = name.rpartition(".")
    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith(package + ".") or getattr(module, attr, None) is not obj:
            continue
        try:
            comment = ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", attr))
        except PycodeError:
            continue
        if comment:
            lines.extend(comment)
            return


def setup(app):
    # NB: before napoleon (priority 500), which would rewrite a type's docstring
    # ("The DDP reference net: ...") so that it no longer matches.
    app.connect("autodoc-process-docstring", _drop_type_docstrings, priority=400)
    app.connect("autodoc-process-docstring", _reexported_data_comments)
