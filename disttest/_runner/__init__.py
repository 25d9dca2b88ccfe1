"""The shared core: launch, join, timeout, collect, report.

One join loop (:mod:`.join`) serves every runner through the
:class:`~.launcher.Launcher` protocol; outcomes (:mod:`.outcome`) and the
report (:mod:`.report`) are the same for processes, threads and pools.
"""
