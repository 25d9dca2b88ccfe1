"""``python -m disttest.migrate PATH...``."""

import sys

from disttest.migrate import main

sys.exit(main())
