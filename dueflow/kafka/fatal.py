"""A client call that serves callbacks, with its fatal error raised as it should be.

A fatal client error (a transactional producer fenced by a newer one, a
sequence out of order) surfaces in the next call that serves the client's
callbacks: ``poll`` and ``flush``. confluent-kafka raises it from its error
callback, and with confluent-kafka 2.16 on Python 3.11 it can come out as the
bare :class:`~confluent_kafka.KafkaError` object instead of a
:class:`~confluent_kafka.KafkaException`: the callback machinery fetches the
not yet normalized exception and restores its value as if it were one. No
``except`` clause that names a class catches that, so an emitter fenced while
its lease was being revoked died in the chaos suite instead of closing its
session. :func:`served` turns it back into the :class:`KafkaException` the
callers handle.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")


def served(call: Callable[[float], T], timeout_s: float) -> T:
    """``call(timeout_s)`` (a client's ``poll`` or ``flush``); a bare
    :class:`KafkaError` it raises is raised as :class:`KafkaException`."""
    try:
        return call(timeout_s)
    except KafkaException:
        raise
    except:  # the bare KafkaError is no BaseException: nothing else catches it
        raised = sys.exc_info()[1]
        if isinstance(raised, KafkaError):
            raise KafkaException(raised) from None
        raise
