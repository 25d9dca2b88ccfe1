"""README.rst: the API reference lists every public name, the document
renders without a docutils message, and no stray backtick turns a name into
a citation or a reference (as it once did to ``MockProcessGroup``)."""

from __future__ import annotations

import io
import os
import re
import unittest

import docutils.core
import docutils.nodes

import disttest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.rst")


def readme() -> str:
    with open(README) as f:
        return f.read()


def section(title: str) -> str:
    text = readme()
    start = text.index(f"\n{title}\n{'-' * len(title)}\n")
    end = re.search(r"\n[^\n]+\n-{3,}\n", text[start + len(title) + 4:])
    return text[start:start + len(title) + 4 + (end.start() if end else len(text))]


class ReadmeReferenceTest(unittest.TestCase):
    def test_every_public_name_has_a_line(self):
        listed = set(re.findall(r"^   - ``([A-Za-z_][A-Za-z_0-9]*)``", section("API reference"), re.M))
        self.assertEqual(sorted(set(disttest.__all__) - listed), [])

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
        self.assertIn("MockProcessGroup", literals)

    def test_install_names_the_distribution(self):
        text = readme()
        self.assertIn("pip install torch-disttest", text)
        self.assertIn("pip install torch-disttest", section("Migrating from ``torch.testing._internal``"))
        self.assertNotIn("pip install disttest", text)


if __name__ == "__main__":
    unittest.main()
