"""The published Avro contract of dueflow: the ``.avsc`` files, data only.

The current schemas sit here (``job.avsc``, ``outcome.avsc`` ...), released
older versions in ``v1/`` and ``v2/``. Any Kafka client reads and writes
dueflow's records with them; dueflow's own codec
(:mod:`dueflow.records.codec`) loads them as package data.
"""
