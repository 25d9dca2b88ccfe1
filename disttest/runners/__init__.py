"""The base classes a suite subclasses: ``TestCase`` (``case``) and the three
runners, ``MultiProcessTestCase`` (``multiprocess``), ``MultiThreadedTestCase``
(``multithread``) and ``MultiProcContinousTest`` (``continuous``), plus
``run_in`` (``modes``), which makes one body run as each.

The runners differ only in how ranks start and live; launching, joining,
timeouts and reports are the core's (:mod:`disttest._runner`).

Layer: above the core, below the subsystem bases and the tools."""

__unittest = True
