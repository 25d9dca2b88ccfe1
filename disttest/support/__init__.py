"""The sibling helpers of upstream's harness, each one concept: skip
decorators and the TEST_SKIPS protocol (``skips``), the file barrier and lock
(``barrier``), temp dirs (``tempdirs``), stores and ports (``stores``),
devices (``devices``), test helpers (``helpers``), DDP reference models
(``models``), tensor builders (``tensors``) and launcher detection
(``launchers``).

Layer: above ``_compat``/``config``, below the core and the runners; usable in
any rank and in the test process alike."""

__unittest = True
