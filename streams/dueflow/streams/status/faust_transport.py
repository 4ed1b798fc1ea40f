"""A faust transport whose consumer reads committed records only.

faust makes its consumer ``read_committed`` only with
``processing_guarantee="exactly_once"``, and that mode is not usable: its
per-partition transactional producers crash with "Can't send messages while
not in transaction" as soon as a table changes (faust-streaming issues #177,
#323, #136; reproduced here against Kafka 4.1 with aiokafka 0.14). The status
view therefore runs ``at_least_once`` (table changes are idempotent: a
replayed outcome folds to the same view) and uses this transport, which sets
the isolation level of faust's aiokafka consumer to ``read_committed`` so
outcomes written inside aborted emitter or worker transactions never show.
"""

from __future__ import annotations

import logging
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka keeps the setting here until start() builds its fetcher.
        if not hasattr(consumer, "_isolation_level"):
            raise RuntimeError(
                "this aiokafka version has no _isolation_level: "
                "the status view cannot make its consumer read_committed"
            )
        consumer._isolation_level = "read_committed"
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ReadCommittedConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


def install(app: Any) -> None:
    """Make ``app`` consume read_committed (call right after creating it)."""
    app.transport = ReadCommittedTransport(app.conf.broker_consumer, app)
    # faust's services log their lifecycle under their module's name, which is
    # this dueflow module: keep that chatter out of dueflow's INFO stream.
    logging.getLogger(__name__).setLevel(logging.WARNING)
