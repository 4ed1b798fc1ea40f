"""Helpers shared by tests and benchmarks (no fixtures here)."""
