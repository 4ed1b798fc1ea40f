"""The demo: dueflow's main job end to end on a real broker (``make demo``).

Run it with ``python -m dueflow.demo`` (see :mod:`dueflow.demo.run`). The
pieces: :mod:`~dueflow.demo.workload` (what is scheduled, pure),
:mod:`~dueflow.demo.tasks` (the handlers), :mod:`~dueflow.demo.ledger` (what
they did), :mod:`~dueflow.demo.observer` (what Kafka shows),
:mod:`~dueflow.demo.summary` (the verdict, pure), :mod:`~dueflow.demo.stack`
(broker, topics and processes), :mod:`~dueflow.demo.display` (progress bars).
"""
