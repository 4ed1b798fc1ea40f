"""Kafka I/O of dueflow: clients, the topic layout and its admin, group settings, cluster views."""
