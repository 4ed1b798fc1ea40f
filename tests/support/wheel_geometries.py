"""Wheel geometries the pure placement tests share (test_wheel, test_timer_record)."""

from __future__ import annotations

from dueflow.rules.wheel import WheelGeometry, WheelLevel

GEO = WheelGeometry().validate()  # the default wheel
# Levels of 1 s, 6.4 s and 28.8 s: every level is reached within seconds.
SMALL = WheelGeometry(
    levels=(WheelLevel(10, 100), WheelLevel(8, 800), WheelLevel(6, 4800)),
    near_partitions=2,
    near_window_ms=250,
    lookahead_ms=50,
).validate()
