package dueflow

import "hash/crc32"

// Level is one level of the timing wheel: Slots partitions of WidthMs each.
type Level struct {
	Slots   int64
	WidthMs int64
}

// Wheel is the timer topic's geometry; use the cluster's (`dueflow topics describe`).
type Wheel struct {
	NearPartitions int64
	NearWindowMs   int64
	LookaheadMs    int64
	Levels         []Level
	Shards         int64 // 0 means 1
}

// DefaultWheel is dueflow's default geometry.
var DefaultWheel = Wheel{
	NearPartitions: 4,
	NearWindowMs:   2_000,
	LookaheadMs:    500,
	Levels:         []Level{{64, 1_000}, {64, 60_000}, {64, 3_600_000}, {64, 86_400_000}},
	Shards:         1,
}

func (w Wheel) shards() int64 {
	if w.Shards < 1 {
		return 1
	}
	return w.Shards
}

// ShardPartitions is the partition count of one shard: near partitions and every level's slots.
func (w Wheel) ShardPartitions() int64 {
	n := w.NearPartitions
	for _, lv := range w.Levels {
		n += lv.Slots
	}
	return n
}

// TotalPartitions is the partition count of the whole timer topic.
func (w Wheel) TotalPartitions() int64 { return w.shards() * w.ShardPartitions() }

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// Partition is the timer-topic partition of a timer with key due at dueMs, written
// at nowMs: the placement rule of docs/wire-format.md.
func (w Wheel) Partition(dueMs, nowMs int64, key []byte) int32 {
	spread := int64(crc32.ChecksumIEEE(key))
	first := ((spread >> 16) % w.shards()) * w.ShardPartitions()
	delta := dueMs - nowMs
	if delta <= w.NearWindowMs {
		return int32(first + spread%w.NearPartitions)
	}
	base := first + w.NearPartitions
	for _, lv := range w.Levels {
		reach := (lv.Slots-1)*lv.WidthMs - w.LookaheadMs
		if delta <= reach {
			return int32(base + floorMod(floorDiv(dueMs, lv.WidthMs), lv.Slots))
		}
		base += lv.Slots
	}
	top := w.Levels[len(w.Levels)-1]
	reach := (top.Slots-1)*top.WidthMs - w.LookaheadMs
	return int32(base - top.Slots + floorMod(floorDiv(nowMs+reach, top.WidthMs), top.Slots))
}
