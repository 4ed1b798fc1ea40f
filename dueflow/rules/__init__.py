"""Pure rules of dueflow: the timing wheel, draining, backoff, jitter, cron, job state; no I/O."""
