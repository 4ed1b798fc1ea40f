"""Observability of every dueflow process: Prometheus metrics, OpenTelemetry tracing, JSON logs."""
