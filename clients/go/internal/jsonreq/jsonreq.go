// Package jsonreq reads requests and wheels in the JSON shape of the conformance
// vectors and the example program: task, queue, payload {json_text | json |
// bytes_hex | bytes_fill}, delay_ms | run_at_ms, job_id, idempotency_key,
// max_attempts, timeout_ms, labels.
package jsonreq

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"time"

	dueflow "dueflow.dev/client"
)

// Request is the request of doc.
func Request(doc map[string]json.RawMessage) (*dueflow.Request, error) {
	var task string
	if err := json.Unmarshal(doc["task"], &task); err != nil {
		return nil, err
	}
	var opts []dueflow.Option
	if raw, ok := doc["payload"]; ok {
		payload, err := Payload(raw)
		if err != nil {
			return nil, err
		}
		if payload != nil {
			opts = append(opts, payload)
		}
	}
	str := func(name string, f func(string) dueflow.Option) {
		if raw, ok := doc[name]; ok {
			var s string
			_ = json.Unmarshal(raw, &s)
			opts = append(opts, f(s))
		}
	}
	num := func(name string, f func(int64) dueflow.Option) {
		if raw, ok := doc[name]; ok {
			var n int64
			_ = json.Unmarshal(raw, &n)
			opts = append(opts, f(n))
		}
	}
	str("queue", dueflow.Queue)
	str("job_id", dueflow.JobID)
	str("idempotency_key", dueflow.IdempotencyKey)
	num("delay_ms", dueflow.AfterMs)
	num("run_at_ms", dueflow.AtMs)
	num("max_attempts", dueflow.MaxAttempts)
	num("timeout_ms", func(ms int64) dueflow.Option { return dueflow.Timeout(time.Duration(ms) * time.Millisecond) })
	if raw, ok := doc["labels"]; ok {
		var labels map[string]string
		if err := json.Unmarshal(raw, &labels); err != nil {
			return nil, err
		}
		opts = append(opts, dueflow.Labels(labels))
	}
	return dueflow.NewRequest(task, opts...), nil
}

// Payload is the payload option of doc ({json_text | json | bytes_hex |
// bytes_fill}); nil when it has none.
func Payload(doc json.RawMessage) (dueflow.Option, error) {
	var pay map[string]json.RawMessage
	if err := json.Unmarshal(doc, &pay); err != nil {
		return nil, err
	}
	switch {
	case pay["json_text"] != nil:
		var text string
		_ = json.Unmarshal(pay["json_text"], &text)
		return dueflow.JSONText(text), nil
	case pay["json"] != nil:
		var v any
		_ = json.Unmarshal(pay["json"], &v)
		return dueflow.JSON(v), nil
	case pay["bytes_hex"] != nil:
		var text string
		_ = json.Unmarshal(pay["bytes_hex"], &text)
		b, err := hex.DecodeString(text)
		if err != nil {
			return nil, err
		}
		return dueflow.Bytes(b), nil
	case pay["bytes_fill"] != nil:
		var fill struct{ Byte, Count int }
		_ = json.Unmarshal(pay["bytes_fill"], &fill)
		return dueflow.Bytes(bytes.Repeat([]byte{byte(fill.Byte)}, fill.Count)), nil
	}
	return nil, nil
}

// Wheel is the geometry of doc.
func Wheel(doc json.RawMessage) (dueflow.Wheel, error) {
	var w struct {
		NearPartitions int64      `json:"near_partitions"`
		NearWindowMs   int64      `json:"near_window_ms"`
		LookaheadMs    int64      `json:"lookahead_ms"`
		Levels         [][2]int64 `json:"levels"`
		Shards         int64      `json:"shards"`
	}
	if err := json.Unmarshal(doc, &w); err != nil {
		return dueflow.Wheel{}, err
	}
	out := dueflow.Wheel{NearPartitions: w.NearPartitions, NearWindowMs: w.NearWindowMs, LookaheadMs: w.LookaheadMs, Shards: w.Shards}
	for _, lv := range w.Levels {
		out.Levels = append(out.Levels, dueflow.Level{Slots: lv[0], WidthMs: lv[1]})
	}
	return out, nil
}
