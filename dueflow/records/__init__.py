"""dueflow's records: the Avro codec, and the timer, job, cron and queue records on it (pure)."""
