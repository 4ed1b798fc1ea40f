"""The emitter: drains the timer topic's timing wheel into the exec topics.

See shared/DESIGN.md ("The timer topic is a timing wheel", "One active
emitter, fenced", "Cron schedules") and :mod:`dueflow.rules.drain` for the rules.
"""

from dueflow.streams.emitter.process import EmitterProcess

__all__ = ["EmitterProcess"]
