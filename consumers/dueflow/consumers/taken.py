"""The records of an async attempt the watchdog took from a blocked event loop.

The loop is blocked, so nothing on it can record the attempt: the watchdog's
thread builds its failure records (retry record or dead letter, key state,
outcome: the recorder's own rules, in a recorder of its own) and commits them
in a transaction of their own on the queue's transaction thread, after any
commit under way there. The transaction sends the partition's committed
offset, unchanged, as the fence: a member that lost the partition is refused
(KIP-447), and a new owner's read of the offsets waits for it. The committed
offset is the later of the one the partition had when it was assigned and
the last one this member's transactions committed (the transaction thread
knows it; the loop, blocked, may not have heard yet). The offset moves past
the record with the loop's next batch, once the loop learns how this went.
"""

from __future__ import annotations

import concurrent.futures
import time

from confluent_kafka import TopicPartition

from dueflow.consumers.committer import Batch, TransactionalCommitter
from dueflow.consumers.failures import Failure
from dueflow.consumers.feeds import Delivery
from dueflow.consumers.recorder import BatchRecorder, Final
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor


def commit_taken(
    d: Delivery,
    failure: Failure,
    seconds: float,
    *,
    recorder: BatchRecorder,
    committer: TransactionalCommitter,
    txn_thread: DaemonThreadExecutor,
    now_ms: int,
    commit_window_s: float,
    deadline_s: float,
) -> list[Final]:
    """Commit ``d``'s failure records (blocking, on the calling thread, never the loop);
    the final key states they set.

    Raises what the commit raised (nothing of it is visible then), or
    :class:`ClientWedged` when it did not return within ``deadline_s`` (whether it
    committed is not known)."""
    recorder.failed(d, failure, seconds, now_ms)
    records, finals = recorder.records, recorder.finals
    feed = d.feed
    where = (feed.topic, feed.partition)
    commit_by = time.monotonic() + commit_window_s

    def commit() -> None:  # on the transaction thread
        at = max(
            feed.committed if feed.committed is not None else -1,
            committer.committed_offsets.get(where, -1),
        )
        offsets = [TopicPartition(feed.topic, feed.partition, at)] if at >= 0 else []
        committer.commit(Batch(records, offsets, lambda: feed.gone, commit_by))

    try:
        txn_thread.submit(commit).result(deadline_s)
    except concurrent.futures.TimeoutError:
        raise ClientWedged(
            f"the blocked attempt's commit did not return within {deadline_s:.0f} s"
        ) from None
    recorder.flush_metrics()
    return finals
