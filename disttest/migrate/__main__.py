"""``python -m disttest.migrate PATH...``."""

import sys

from disttest.migrate._cli import main_piped

__unittest = True

sys.exit(main_piped())
