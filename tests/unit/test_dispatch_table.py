"""The dispatcher's table has an action for every verdict kind decide can give."""

from __future__ import annotations

from dueflow.consumers.decision import Kind
from dueflow.consumers.dispatch import _ACTIONS


def test_every_verdict_kind_has_an_action() -> None:
    assert set(_ACTIONS) == {kind.value for kind in Kind}
    assert all(kind._value_ in _ACTIONS for kind in Kind)  # the key the dispatcher looks up
