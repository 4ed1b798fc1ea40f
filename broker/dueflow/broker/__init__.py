"""A single-node Apache Kafka broker (KRaft) run from Maven Central jars."""

from dueflow.broker.local import BrokerPaths, LocalBroker, default_cache_dir, fetch_jars

__all__ = ["BrokerPaths", "LocalBroker", "default_cache_dir", "fetch_jars"]
