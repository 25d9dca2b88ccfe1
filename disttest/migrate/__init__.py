"""``python -m disttest.migrate``: move a suite's imports of torch's private
testing modules (``torch.testing._internal``) to disttest.

Every name disttest offers moves to its documented home; a name it does not
offer stays imported from torch and is reported, so the suite keeps running.
Files are changed in place (``--check`` and ``--diff`` change nothing).
Needs libcst (``pip install torch-disttest[migrate]``).
"""

from __future__ import annotations

__unittest = True

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command; return its exit status (see ``--help``)."""
    from disttest.migrate._cli import main as run

    return run(argv)
