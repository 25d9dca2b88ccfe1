"""The documentation stays true: docs/ builds with warnings as errors, its API
reference names every public name, every Python example in it (and in
README.rst) runs, and the troubleshooting page lists every error disttest
raises.

Python examples are either ``.. code-block:: python`` blocks, each preceded
by a comment that says how it runs (``.. docs-test: unittest``, ``pytest``,
``python``, or ``skip <reason>``), or literalincludes of files under
examples/ (run by tests/test_examples.py) or docs/examples/ (run here).
"""

from __future__ import annotations

import ast
import importlib
import os
import pathlib
import posixpath
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest
import warnings
from dataclasses import dataclass

import disttest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGE = ROOT / "disttest"
TROUBLESHOOTING = DOCS / "troubleshooting.rst"

# Blocks that do not run here, each with its reason (the marker's text).
NOT_RUN = {
    ("docs/howto/backend-suite.rst", "runs PyTorch's whole backend suite (about 25 s per world size and "
                                     "BACKEND/WORLD_SIZE in the environment); make backend-suite runs it"),
}
KINDS = ("unittest", "pytest", "python", "skip")
PYTHON_LANGUAGES = ("python", "py", "python3", "pycon", "ipython")

# Module-level strings that look like messages but are not raised or shown
# as a line of their own.
NOT_MESSAGES = {
    "disttest._runner.thread_pool.IDLE_NAME": "a thread's name",
    "disttest.faults.pytest_options.REPEAT_SECTION": "a pytest report section's title",
    "disttest._runner.report.NEVER_MARK": "a prefix of the never-fired line",
    "disttest._runner.report.DELAYED_MARK": "the prefix of a rank's fuzzing-delay entry, never shown",
    "disttest._runner.report.SECTION": "a pytest report section's title (one per group of ranks)",
}


def rst_files() -> list[pathlib.Path]:
    return [ROOT / "README.rst"] + sorted(p for p in DOCS.rglob("*.rst") if "_build" not in p.parts)


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass
class Block:
    source: str  # the .rst file, relative to the root
    line: int
    kind: str  # unittest, pytest, python, skip; "" when unmarked
    reason: str
    code: str


def directive_body(lines: list[str], start: int) -> str:
    """The indented body of the directive on line ``start`` (options skipped)."""
    i = start + 1
    while i < len(lines) and re.match(r"\s+:[\w-]+:", lines[i]):
        i += 1
    body = []
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
        body.append(lines[i])
        i += 1
    return textwrap.dedent("\n".join(body)).strip("\n") + "\n"


def code_blocks(path: pathlib.Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*\.\. (?:code-block|code|sourcecode)::\s*(\S+)", line)
        if not m or m.group(1) not in PYTHON_LANGUAGES:
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = re.match(r"\s*\.\. docs-test: (\w+) ?(.*)$", lines[j]) if j >= 0 else None
        kind, reason = (marker.group(1), marker.group(2).strip()) if marker else ("", "")
        blocks.append(Block(rel(path), i + 1, kind, reason, directive_body(lines, i)))
    return blocks


def other_literal_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """``::`` blocks and code blocks in languages other than Python."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*\.\. (?:code-block|code|sourcecode)::\s*(\S+)", line)
        if m and m.group(1) not in PYTHON_LANGUAGES:
            out.append((i + 1, directive_body(lines, i)))
        elif line.rstrip().endswith("::") and not re.match(r"\s*\.\. ", line):
            out.append((i + 1, directive_body(lines, i)))
    return out


def looks_like_python(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # shell text: invalid escape sequences
            tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)) for n in ast.walk(tree))


def includes(path: pathlib.Path) -> list[pathlib.Path]:
    found = re.findall(r"^\s*\.\. literalinclude:: (\S+)", path.read_text(), re.M)
    return [(path.parent / f).resolve() for f in found]


def all_blocks() -> list[Block]:
    return [b for p in rst_files() for b in code_blocks(p)]


def module_name(block: Block, n: int) -> str:
    return "doc_" + re.sub(r"\W", "_", block.source.removesuffix(".rst")) + f"_{n}"


def run_examples() -> dict[str, subprocess.CompletedProcess[str] | list]:
    """Run every runnable block and docs/examples/test_*.py; one interpreter per kind."""
    results: dict = {"unittest": None, "pytest": None, "python": []}
    with tempfile.TemporaryDirectory() as tmp:
        unit, pyt = [], []
        for n, block in enumerate(all_blocks()):
            name = module_name(block, n)
            (pathlib.Path(tmp) / f"{name}.py").write_text(block.code)
            if block.kind == "unittest":
                unit.append(name)
            elif block.kind == "pytest":
                pyt.append(name)
            elif block.kind == "python":
                results["python"].append((block, subprocess.run(
                    [sys.executable, f"{name}.py"], cwd=tmp, capture_output=True, text=True, timeout=300)))
        for example in sorted((DOCS / "examples").glob("test_*.py")):
            (pathlib.Path(tmp) / example.name).write_text(example.read_text())
            unit.append(example.stem)
        results["unittest_modules"] = unit
        results["unittest"] = subprocess.run(
            [sys.executable, "-m", "unittest", "-v", *unit], cwd=tmp, capture_output=True, text=True, timeout=600)
        results["pytest_modules"] = pyt
        if pyt:
            results["pytest"] = subprocess.run(
                [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *[f"{m}.py" for m in pyt]],
                cwd=tmp, capture_output=True, text=True, timeout=600)
    return results


class CodeBlocksTest(unittest.TestCase):
    """Every Python example in the docs is run, or marked as not runnable."""

    results: dict

    @classmethod
    def setUpClass(cls):
        cls.results = run_examples()

    def test_every_python_block_says_how_it_runs(self):
        blocks = all_blocks()
        self.assertGreater(len(blocks), 5)
        self.assertEqual([f"{b.source}:{b.line}" for b in blocks if b.kind not in KINDS], [])

    def test_only_the_listed_blocks_do_not_run(self):
        skipped = {(b.source, b.reason) for b in all_blocks() if b.kind == "skip"}
        self.assertEqual(skipped, NOT_RUN)

    def test_no_python_hides_in_other_blocks(self):
        hidden = [f"{rel(p)}:{line}" for p in rst_files() for line, text in other_literal_blocks(p)
                  if looks_like_python(text)]
        self.assertEqual(hidden, [])

    def test_literalincludes_are_files_the_tests_run(self):
        allowed = (ROOT / "examples", DOCS / "examples")
        bad = [f"{rel(p)}: {f}" for p in rst_files() for f in includes(p)
               if not f.is_file() or not any(f.is_relative_to(a) for a in allowed)
               or (f.is_relative_to(DOCS / "examples") and not f.name.startswith("test_"))]
        self.assertEqual(bad, [])
        self.assertTrue(any(f.is_relative_to(DOCS / "examples") for p in rst_files() for f in includes(p)))

    def test_unittest_blocks_and_docs_examples_pass(self):
        proc = self.results["unittest"]
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        for module in self.results["unittest_modules"]:
            with self.subTest(module=module):
                outcomes = re.findall(rf"\({re.escape(module)}\.[\w.]+\) \.\.\. (\w+)", out)
                self.assertTrue(outcomes, f"{module} ran no test:\n{out[-3000:]}")
                self.assertEqual([o for o in outcomes if o not in ("ok", "skipped")], [], out[-3000:])

    def test_the_simulated_4096_rank_example_passes(self):
        # issue 26's DTensor test at world size 4096 (tests/test_simulated.py
        # leaves it to this example)
        block = next(b for b in all_blocks() if "class RedistributeAt4096(disttest.SimulatedTestCase)" in b.code)
        self.assertIn("world_size = 4096", block.code)
        self.assertIn("self.mesh(16, 16, 16)", block.code)
        out = self.results["unittest"].stderr
        self.assertRegex(out, r"\(doc_docs_howto_scale_\d+\.RedistributeAt4096\.test_redistribute\) \.\.\. ok")

    def test_pytest_blocks_pass(self):
        proc = self.results["pytest"]
        self.assertIsNotNone(proc)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        for module in self.results["pytest_modules"]:
            self.assertRegex(out, rf"{module}\.py::\w+ PASSED")

    def test_python_blocks_exit_zero(self):
        for block, proc in self.results["python"]:
            with self.subTest(block=f"{block.source}:{block.line}"):
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_the_tutorials_failure_report_is_what_disttest_prints(self):
        text = (DOCS / "tutorial.rst").read_text()
        shown = re.search(r"^    (disttest\.RankFailure: .*)$", text, re.M).group(1)
        source = (DOCS / "examples" / "test_tutorial.py").read_text()
        broken = source.replace("            p.grad /= world\n", "")
        self.assertNotEqual(broken, source)
        with tempfile.TemporaryDirectory() as tmp:
            (pathlib.Path(tmp) / "test_tutorial.py").write_text(broken)
            proc = subprocess.run([sys.executable, "-m", "unittest", "test_tutorial.AverageOnThreads"],
                                  cwd=tmp, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn(shown, proc.stderr)


class BuildTest(unittest.TestCase):
    """``make docs``' command builds; the reference names every public name.

    The build here uses Sphinx's plain ``basic`` theme: furo draws the whole
    site's navigation into every page, 18 of the build's 47 s here, and
    adds nothing to what these tests read (warnings, the inventory).
    ``make docs`` (CI runs it) builds the site with furo, warnings as errors.
    """

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.proc = subprocess.run(
            [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-D", "html_theme=basic",
             str(DOCS), cls.tmp.name],
            capture_output=True, text=True, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def inventory(self) -> dict[str, dict[str, tuple]]:
        from sphinx.util.inventory import InventoryFile

        with open(os.path.join(self.tmp.name, "objects.inv"), "rb") as f:
            inv = InventoryFile.load(f, "", posixpath.join)
        return {kind: dict(entries) for kind, entries in (inv.items() if hasattr(inv, "items") else inv.data.items())}

    def test_builds_with_warnings_as_errors(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout + self.proc.stderr)
        self.assertEqual(self.proc.stderr, "")

    def test_the_reference_names_every_public_name(self):
        documented = {name for kind, entries in self.inventory().items() if kind.startswith("py:") for name in entries}
        self.assertEqual(sorted(f"disttest.{n}" for n in disttest.__all__ if f"disttest.{n}" not in documented), [])

    def test_the_submodules_have_pages(self):
        inv = self.inventory()
        modules = set(inv.get("py:module", {}))
        for module in ("disttest.bases.dtensor", "disttest.bases.fsdp", "disttest.support.launchers", "disttest.conformance",
                       "disttest.faults", "disttest.pytest_plugin"):
            self.assertIn(module, modules)
            mod = importlib.import_module(module)
            if module != "disttest.pytest_plugin":
                documented = {n for entries in inv.values() for n in entries}
                self.assertEqual([n for n in mod.__all__ if f"{module}.{n}" not in documented
                                  and f"disttest.{n}" not in documented], [], module)

    def test_the_plugin_page_lists_every_option(self):
        page = (DOCS / "reference" / "pytest-plugin.rst").read_text()
        source = (PACKAGE / "pytest_plugin.py").read_text() + "".join(
            p.read_text() for p in PACKAGE.rglob("*.py") if "addoption" in p.read_text())
        options = set(re.findall(r"\"(--disttest-[a-z-]+)", source))
        self.assertGreater(len(options), 5)
        self.assertEqual(sorted(o for o in options if o not in page), [])

    def test_the_plugin_page_names_every_mode(self):
        from disttest.runners.modes import FORCED_MODES

        page = (DOCS / "reference" / "pytest-plugin.rst").read_text()
        row = next(line for line in page.splitlines() if line.startswith("``--disttest-mode="))
        self.assertEqual([m for m in FORCED_MODES if f"``{m}``" not in row], [])


# --- the troubleshooting page ------------------------------------------------


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def message_templates(source: str, module: str) -> dict[str, str]:
    """The message constants of one module: module-level UPPER_CASE strings
    with a space in them that a ``raise`` uses, that say they come from
    disttest, or that a report module (report.py, judge.py) defines."""
    tree = ast.parse(source)
    constants = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            text = _string(node.value)
            for t in targets:
                if text and " " in text.strip() and isinstance(t, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]*", t.id):
                    constants[t.id] = text
    raised = {n.id for r in ast.walk(tree) if isinstance(r, ast.Raise) and r.exc
              for n in ast.walk(r.exc) if isinstance(n, ast.Name)}
    report_module = module.rsplit(".", 1)[-1] in ("report", "judge")
    return {f"{module}.{name}": text for name, text in constants.items()
            if name in raised or "disttest" in text or report_module}


def exception_classes() -> dict[str, type]:
    """Every exception class defined in a disttest module, and every one
    ``disttest`` exports."""
    found: dict[str, type] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        names = [n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]
        if not names:
            continue
        module = importlib.import_module(_module_name(path))
        for name in names:
            obj = getattr(module, name, None)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found[name] = obj
    for name in disttest.__all__:
        obj = getattr(disttest, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            found[obj.__name__] = obj
    return found


def normalized(text: str) -> str:
    return " ".join(text.replace("{{", "{").replace("}}", "}").split())


class TroubleshootingTest(unittest.TestCase):
    page = TROUBLESHOOTING.read_text()

    def test_every_exception_class_has_an_entry(self):
        classes = exception_classes()
        for known in ("ConfigError", "RankFailure", "CollectiveMismatch", "InjectedFault", "DistSkip"):
            self.assertIn(known, classes)
        missing = [name for name in sorted(classes)
                   if f"``{name}``" not in self.page and not re.search(rf":class:`[~\w.]*\b{name}`", self.page)]
        self.assertEqual(missing, [], "add an entry to docs/troubleshooting.rst for each")

    def test_every_message_template_is_quoted(self):
        templates = {}
        for path in sorted(PACKAGE.rglob("*.py")):
            templates.update(message_templates(path.read_text(), _module_name(path)))
        self.assertIn("disttest.config.INVALID_VALUE", templates)
        self.assertGreater(len(templates), 40)
        page = normalized(self.page)
        missing = [f"{name}: {text!r}" for name, text in sorted(templates.items())
                   if name not in NOT_MESSAGES and normalized(text) not in page]
        self.assertEqual(missing, [], "quote each in docs/troubleshooting.rst, with its cause and fix")
        self.assertEqual(sorted(set(NOT_MESSAGES) - set(templates)), [], "stale NOT_MESSAGES entries")

    def test_the_scanner_finds_a_new_message_or_exception(self):
        source = textwrap.dedent("""\
            NEW = "the thing broke (disttest): {why}"
            QUIET = "a raised text"
            NAME_ONLY = "DISTTEST_X"

            class NewError(RuntimeError):
                pass

            def f():
                raise NewError(QUIET)
        """)
        self.assertEqual(set(message_templates(source, "disttest.m")), {"disttest.m.NEW", "disttest.m.QUIET"})
        self.assertNotIn("``NewError``", self.page)


class ReadmeTest(unittest.TestCase):
    def test_readme_is_a_landing_page(self):
        text = (ROOT / "README.rst").read_text()
        self.assertLessEqual(len(text.splitlines()), 300)
        for command in ("pip install torch-disttest", "make test", "make examples", "make docs"):
            self.assertIn(command, text)

    def test_readme_links_to_docs_pages_that_exist(self):
        text = (ROOT / "README.rst").read_text()
        links = re.findall(r"<((?:docs/)?[\w/.-]+\.rst)>`_", text)
        self.assertGreater(len(links), 10)
        self.assertEqual([link for link in links if not (ROOT / link).is_file()], [])


if __name__ == "__main__":
    unittest.main()
