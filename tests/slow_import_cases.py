"""A test class whose module the fork server imports slowly when the test
process's ``sys.argv`` asks for it (tests/test_multiprocess.py: a fork
server that does not answer). Only that test imports this module."""

import sys
import time

from mp_cases import Base

SLOW_ARG = "--disttest-test-slow-import"
if SLOW_ARG in sys.argv:  # in the fork server, which imports the module under the test process's argv
    time.sleep(float(sys.argv[sys.argv.index(SLOW_ARG) + 1]))


class SlowToImport(Base):
    def test_rank(self):
        self.assertIn(self.rank, (0, 1))
