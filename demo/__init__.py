"""The demo: dueflow's main job end to end on a real broker (``make demo``).

Run it with ``python -m demo`` (see :mod:`demo.run`). The
pieces: :mod:`~demo.workload` (what is scheduled, pure),
:mod:`~demo.tasks` (the handlers), :mod:`~demo.ledger` (what
they did), :mod:`~demo.observer` (what Kafka shows),
:mod:`~demo.summary` (the verdict, pure), :mod:`~demo.stack`
(broker, topics and processes), :mod:`~demo.display` (progress bars).
"""
