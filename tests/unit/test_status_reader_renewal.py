"""When the status view gives its cluster reader up and starts fresh clients."""

from __future__ import annotations

from dueflow.streams.status.cluster_refresh import reader_stuck

TIMEOUT = 'KafkaError{code=_TIMED_OUT,val=-185,str="Local: Timed out"}'


def test_group_calls_timing_out_while_the_broker_answers_is_a_stuck_reader() -> None:
    assert reader_stuck(
        [
            f"committed offsets of group p.worker.jobs: {TIMEOUT}",
            f"emitter group p.emitter: {TIMEOUT}",
        ]
    )


def test_a_broker_that_is_down_or_a_missing_topic_is_not() -> None:
    assert not reader_stuck([])
    assert not reader_stuck(["topic p.dlq.jobs: not found (run `dueflow topics ensure`)"])
    assert not reader_stuck(
        [f"cluster metadata: {TIMEOUT}", f"committed offsets of group p.worker.jobs: {TIMEOUT}"]
    )
    assert not reader_stuck(
        [
            f"high offsets of p.timers: 3 partitions failed ({TIMEOUT})",
            f"emitter group p.emitter: {TIMEOUT}",
        ]
    )
    assert not reader_stuck(["emitter group p.emitter: KafkaError{code=COORDINATOR_NOT_AVAILABLE}"])


def test_no_group_request_is_sent_while_the_broker_does_not_answer() -> None:
    from dueflow.streams.status.cluster_reader import broker_unreachable

    assert broker_unreachable([f"cluster metadata: {TIMEOUT}"])
    assert broker_unreachable([f"low offsets of p.timers: 3 partitions failed ({TIMEOUT})"])
    assert not broker_unreachable(["topic p.dlq.jobs: not found (run `dueflow topics ensure`)"])
    assert not broker_unreachable([f"committed offsets of group p.worker.jobs: {TIMEOUT}"])
    # an answer that is an error: the broker is there (the group calls go on)
    not_leader = 'KafkaError{code=NOT_LEADER_OR_FOLLOWER,val=6,str="Broker: Not leader"}'
    assert not broker_unreachable([f"low offsets of p.timers: 1 partitions failed ({not_leader})"])
    down = 'KafkaError{code=_TRANSPORT,val=-195,str="Local: Broker transport failure"}'
    assert broker_unreachable([f"cluster metadata: {down}"])
