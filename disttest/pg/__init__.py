"""Process groups disttest provides: the in-process ``threaded`` group that
rank threads share (:mod:`disttest.pg.threaded`) and the group with no peers
behind fake comms (:mod:`disttest.pg.fake`), on one base of c10d's Python
process-group API (:mod:`disttest.pg._local`).

Layer: above ``_compat``/``config``, below the core; nothing here imports a
runner."""

__unittest = True
