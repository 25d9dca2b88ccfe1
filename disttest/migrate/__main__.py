"""``python -m disttest.migrate PATH...``."""

import sys

from disttest.migrate import main

__unittest = True

sys.exit(main())
