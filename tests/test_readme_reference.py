"""README.rst, the landing page: it renders without a docutils message, and
no stray backtick turns a name into a citation or a reference (as it once
did to ``MockProcessGroup``). The list of every public name moved to the
API reference of docs/ (tests/test_docs.py checks it)."""

from __future__ import annotations

import io
import os
import unittest

import docutils.core
import docutils.nodes

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.rst")


def readme() -> str:
    with open(README) as f:
        return f.read()


class ReadmeReferenceTest(unittest.TestCase):
    def test_renders_without_messages_citations_or_stray_references(self):
        warnings = io.StringIO()
        tree = docutils.core.publish_doctree(
            readme(), settings_overrides={"report_level": 1, "halt_level": 5, "warning_stream": warnings})
        self.assertEqual(warnings.getvalue(), "")
        # A single backtick pair is interpreted text: HTML renders it as <cite>.
        for kind in (docutils.nodes.title_reference, docutils.nodes.citation_reference,
                     docutils.nodes.problematic, docutils.nodes.system_message):
            self.assertEqual([n.astext() for n in tree.findall(kind)], [], kind.__name__)
        # Every link is a section of this document or a URL.
        refs = [n for n in tree.findall(docutils.nodes.reference) if "refuri" not in n and "refid" not in n]
        self.assertEqual([n.astext() for n in refs], [])
        literals = {n.astext() for n in tree.findall(docutils.nodes.literal)}
        self.assertIn("MultiProcessTestCase", literals)

    def test_install_names_the_distribution(self):
        text = readme()
        self.assertIn("pip install torch-disttest", text)
        self.assertNotIn("pip install disttest", text)

    def test_at_most_300_lines(self):
        self.assertLessEqual(len(readme().splitlines()), 300)


if __name__ == "__main__":
    unittest.main()
