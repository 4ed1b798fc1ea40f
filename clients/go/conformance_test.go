package dueflow_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/hamba/avro/v2"

	dueflow "dueflow.dev/client"
	"dueflow.dev/client/internal/jsonreq"
)

// The shared conformance table (clients/conformance/vectors.json), made by the Python SDK.
type vectors struct {
	Prefix         string                     `json:"prefix"`
	Queues         []string                   `json:"queues"`
	MaxRecordBytes int                        `json:"max_record_bytes"`
	Wheels         map[string]json.RawMessage `json:"wheels"`
	Placement      []struct {
		Wheel     string `json:"wheel"`
		KeyHex    string `json:"key_hex"`
		NowMs     int64  `json:"now_ms"`
		DueMs     int64  `json:"due_ms"`
		Partition int32  `json:"partition"`
	} `json:"placement"`
	Murmur2 []struct {
		KeyHex     string `json:"key_hex"`
		Partitions int32  `json:"partitions"`
		Partition  int32  `json:"partition"`
	} `json:"murmur2"`
	UUID7 []struct {
		NowMs     int64  `json:"now_ms"`
		RandomHex string `json:"random_hex"`
		JobID     string `json:"job_id"`
	} `json:"uuid7"`
	Schedule   []scheduleCase `json:"schedule"`
	Invalid    []invalidCase  `json:"invalid"`
	Cancel     []changeCase   `json:"cancel"`
	Reschedule []changeCase   `json:"reschedule"`
	Command    []commandCase  `json:"command"`
	Verdict    []verdictCase  `json:"verdict"`
}

type commandCase struct {
	Name string `json:"name"`
	Op   string `json:"op"`
	Job  struct {
		JobID          string `json:"job_id"`
		IdempotencyKey string `json:"idempotency_key"`
		Queue          string `json:"queue"`
	} `json:"job"`
	CommandID     string                     `json:"command_id"`
	AtMs          int64                      `json:"at_ms"`
	KnownDueMs    *int64                     `json:"known_due_ms"`
	DueMs         *int64                     `json:"due_ms"`
	By            *string                    `json:"by"`
	ExpectVersion *string                    `json:"expect_version"`
	Payload       map[string]json.RawMessage `json:"payload"`
	Partitions    int32                      `json:"partitions"`
	Expected      struct {
		Records []record `json:"records"`
	} `json:"expected"`
}

type verdictCase struct {
	Name      string `json:"name"`
	JobID     string `json:"job_id"`
	CommandID string `json:"command_id"`
	Record    record `json:"record"`
	Expected  *struct {
		State   string  `json:"state"`
		Code    string  `json:"code"`
		Reason  string  `json:"reason"`
		DueMs   *int64  `json:"due_ms"`
		Version *string `json:"version"`
	} `json:"expected"`
}

type record struct {
	Topic     string      `json:"topic"`
	Partition *int32      `json:"partition"`
	KeyHex    string      `json:"key_hex"`
	ValueHex  string      `json:"value_hex"`
	Headers   [][2]string `json:"headers"`
}

type scheduleCase struct {
	Name      string                     `json:"name"`
	Wheel     string                     `json:"wheel"`
	NowMs     int64                      `json:"now_ms"`
	RandomHex string                     `json:"random_hex"`
	SchemaID  *int32                     `json:"schema_id"`
	Request   map[string]json.RawMessage `json:"request"`
	Expected  struct {
		JobID       string   `json:"job_id"`
		DueMs       int64    `json:"due_ms"`
		ContentHash string   `json:"content_hash"`
		Records     []record `json:"records"`
	} `json:"expected"`
}

type invalidCase struct {
	Name    string                     `json:"name"`
	Request map[string]json.RawMessage `json:"request"`
	NowMs   int64                      `json:"now_ms"`
	Field   string                     `json:"field"`
}

type changeCase struct {
	Name       string `json:"name"`
	Schedule   string `json:"schedule"`
	AtMs       int64  `json:"at_ms"`
	NewDueMs   int64  `json:"new_due_ms"`
	Partitions int32  `json:"partitions"`
	Expected   struct {
		Records []record `json:"records"`
	} `json:"expected"`
}

func load(t *testing.T) vectors {
	t.Helper()
	raw, err := os.ReadFile("../conformance/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (v vectors) target(t *testing.T, wheel string, schemaID *int32) dueflow.Target {
	w, err := jsonreq.Wheel(v.Wheels[wheel])
	if err != nil {
		t.Fatal(err)
	}
	return dueflow.Target{Prefix: v.Prefix, Wheel: w, MaxRecordBytes: v.MaxRecordBytes, SchemaID: schemaID}
}

func (v vectors) queueCheck(q string) error {
	for _, known := range v.Queues {
		if q == known {
			return nil
		}
	}
	return &dueflow.InvalidInputError{Field: "queue", Value: q, Accepted: "a known queue"}
}

func TestPlacement(t *testing.T) {
	v := load(t)
	for _, c := range v.Placement {
		w, _ := jsonreq.Wheel(v.Wheels[c.Wheel])
		if got := w.Partition(c.DueMs, c.NowMs, unhex(t, c.KeyHex)); got != c.Partition {
			t.Errorf("%+v: got partition %d", c, got)
		}
	}
}

func TestMurmur2(t *testing.T) {
	for _, c := range load(t).Murmur2 {
		if got := dueflow.KeyPartition(unhex(t, c.KeyHex), c.Partitions); got != c.Partition {
			t.Errorf("%+v: got %d", c, got)
		}
	}
}

func TestUUID7(t *testing.T) {
	for _, c := range load(t).UUID7 {
		var r [10]byte
		copy(r[:], unhex(t, c.RandomHex))
		if got := dueflow.UUID7(c.NowMs, r); got != c.JobID {
			t.Errorf("%+v: got %s", c, got)
		}
	}
}

func plan(t *testing.T, v vectors, c scheduleCase, req map[string]json.RawMessage) dueflow.Planned {
	t.Helper()
	r, err := jsonreq.Request(req)
	if err != nil {
		t.Fatal(err)
	}
	random := c.RandomHex
	if random == "" {
		random = "00000000000000000000"
	}
	var tail [10]byte
	copy(tail[:], unhex(t, random))
	p, err := dueflow.Plan(r, c.NowMs, v.target(t, c.Wheel, c.SchemaID), v.queueCheck,
		func(now int64) string { return dueflow.UUID7(now, tail) })
	if err != nil {
		t.Fatalf("%s: %v", c.Name, err)
	}
	return p
}

func checkRecord(t *testing.T, name string, want record, got dueflow.Record) {
	t.Helper()
	wantPartition := int32(-1)
	if want.Partition != nil {
		wantPartition = *want.Partition
	}
	if got.Topic != want.Topic || got.Partition != wantPartition {
		t.Errorf("%s: topic/partition %s/%d, want %s/%d", name, got.Topic, got.Partition, want.Topic, wantPartition)
	}
	if k := hex.EncodeToString(got.Key); k != want.KeyHex {
		t.Errorf("%s: key %s, want %s", name, k, want.KeyHex)
	}
	if val := hex.EncodeToString(got.Value); val != want.ValueHex {
		t.Errorf("%s: value\n got %s\nwant %s", name, val, want.ValueHex)
	}
	var headers [][2]string
	for _, h := range got.Headers {
		headers = append(headers, [2]string{h.Key, h.Value})
	}
	if !reflect.DeepEqual(headers, want.Headers) {
		t.Errorf("%s: headers %v, want %v", name, headers, want.Headers)
	}
}

func TestSchedule(t *testing.T) {
	v := load(t)
	for _, c := range v.Schedule {
		t.Run(c.Name, func(t *testing.T) {
			p := plan(t, v, c, c.Request)
			if p.Job.JobID != c.Expected.JobID || p.Job.DueMs != c.Expected.DueMs || p.Job.ContentHash != c.Expected.ContentHash {
				t.Errorf("job %+v, want %s due %d hash %s", p.Job, c.Expected.JobID, c.Expected.DueMs, c.Expected.ContentHash)
			}
			checkRecord(t, "timer", c.Expected.Records[0], p.Timer)
			checkRecord(t, "outcome", c.Expected.Records[1], p.Outcome)
		})
		if c.Request["payload"] != nil && c.SchemaID == nil {
			var pay map[string]json.RawMessage
			_ = json.Unmarshal(c.Request["payload"], &pay)
			if pay["json"] != nil { // the same bytes from a Go value through encoding/json
				t.Run(c.Name+" (JSON of a value)", func(t *testing.T) {
					req := map[string]json.RawMessage{}
					for k, val := range c.Request {
						req[k] = val
					}
					req["payload"], _ = json.Marshal(map[string]json.RawMessage{"json": pay["json"]})
					checkRecord(t, "timer", c.Expected.Records[0], plan(t, v, c, req).Timer)
				})
			}
		}
	}
}

func TestJobValueDecodesWithJobAvsc(t *testing.T) {
	schemaText, err := os.ReadFile("schemas/job.avsc")
	if err != nil {
		t.Fatal(err)
	}
	schema := avro.MustParse(string(schemaText))
	v := load(t)
	for _, c := range v.Schedule {
		if c.SchemaID != nil {
			continue
		}
		p := plan(t, v, c, c.Request)
		var job map[string]any
		if err := avro.Unmarshal(schema, p.Timer.Value, &job); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if job["job_id"] != p.Job.JobID || job["content_hash"] != p.Job.ContentHash {
			t.Errorf("%s: decoded %v", c.Name, job)
		}
	}
}

func TestInvalid(t *testing.T) {
	v := load(t)
	for _, c := range v.Invalid {
		t.Run(c.Name, func(t *testing.T) {
			r, err := jsonreq.Request(c.Request)
			if err != nil {
				t.Fatal(err)
			}
			_, err = dueflow.Plan(r, c.NowMs, v.target(t, "default", nil), v.queueCheck, func(int64) string { return "generated" })
			var bad *dueflow.InvalidInputError
			if !errors.As(err, &bad) || bad.Field != c.Field {
				t.Fatalf("got %v, want an error naming %s", err, c.Field)
			}
		})
	}
}

func TestCancelAndReschedule(t *testing.T) {
	v := load(t)
	byName := map[string]scheduleCase{}
	for _, c := range v.Schedule {
		byName[c.Name] = c
	}
	for kind, cases := range map[string][]changeCase{"cancel": v.Cancel, "reschedule": v.Reschedule} {
		for _, c := range cases {
			t.Run(kind+": "+c.Name, func(t *testing.T) {
				s := byName[c.Schedule]
				p := plan(t, v, s, s.Request)
				target := v.target(t, s.Wheel, nil)
				var got []dueflow.Record
				var err error
				if kind == "cancel" {
					got, err = dueflow.LegacyCancelRecords(&p.Job, c.AtMs, c.Partitions, target, dueflow.DefaultRetention)
				} else {
					got, err = dueflow.LegacyRescheduleRecords(&p.Job, c.NewDueMs, c.AtMs, c.Partitions, target, dueflow.DefaultRetention)
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(c.Expected.Records) {
					t.Fatalf("%d records, want %d", len(got), len(c.Expected.Records))
				}
				for i := range got {
					checkRecord(t, c.Name, c.Expected.Records[i], got[i])
				}
			})
		}
	}
}

func TestCommands(t *testing.T) {
	v := load(t)
	target := v.target(t, "default", nil)
	noID := func(int64) string { t.Fatal("the case gives its command id"); return "" }
	for _, c := range v.Command {
		t.Run(c.Name, func(t *testing.T) {
			ref := dueflow.JobRef{JobID: c.Job.JobID, Queue: c.Job.Queue, IdempotencyKey: c.Job.IdempotencyKey, KnownDueMs: c.KnownDueMs}
			opts := []dueflow.CommandOption{dueflow.CommandID(c.CommandID)}
			if c.By != nil {
				opts = append(opts, dueflow.By(*c.By))
			}
			if c.ExpectVersion != nil {
				opts = append(opts, dueflow.ExpectVersion(*c.ExpectVersion))
			}
			payloads := []string{"as given"}
			if c.Payload["json"] != nil {
				payloads = append(payloads, "json") // the same bytes from a Go value
			}
			for _, which := range payloads {
				var cmd dueflow.Command
				var err error
				switch c.Op {
				case "cancel":
					cmd, err = dueflow.CancelCommand(ref, c.AtMs, c.Partitions, target, noID, opts...)
				case "move":
					cmd, err = dueflow.MoveCommand(ref, *c.DueMs, c.AtMs, c.Partitions, target, noID, opts...)
				default:
					doc := map[string]json.RawMessage{}
					for k, raw := range c.Payload {
						if which == "as given" || k != "json_text" {
							doc[k] = raw
						}
					}
					raw, _ := json.Marshal(doc)
					payload, perr := jsonreq.Payload(raw)
					if perr != nil {
						t.Fatal(perr)
					}
					patchOpts := opts
					if c.DueMs != nil {
						patchOpts = append(append([]dueflow.CommandOption{}, opts...), dueflow.NewDueMs(*c.DueMs))
					}
					cmd, err = dueflow.PatchCommand(ref, payload, c.AtMs, c.Partitions, target, noID, patchOpts...)
				}
				if err != nil {
					t.Fatal(err)
				}
				if cmd.ID != c.CommandID || cmd.Op != c.Op {
					t.Errorf("command %s %s, want %s %s", cmd.ID, cmd.Op, c.CommandID, c.Op)
				}
				checkRecord(t, c.Name+" ("+which+")", c.Expected.Records[0], cmd.Record)
			}
		})
	}
}

func TestVerdicts(t *testing.T) {
	v := load(t)
	for _, c := range v.Verdict {
		t.Run(c.Name, func(t *testing.T) {
			schema := ""
			for _, h := range c.Record.Headers {
				if h[0] == "df-schema" {
					schema = h[1]
				}
			}
			got := dueflow.VerdictOf(unhex(t, c.Record.KeyHex), unhex(t, c.Record.ValueHex), schema, c.JobID, c.CommandID)
			if c.Expected == nil {
				if got != nil {
					t.Fatalf("got %+v, want none", got)
				}
				return
			}
			want := dueflow.Verdict{State: c.Expected.State, Code: c.Expected.Code, Reason: c.Expected.Reason, DueMs: c.Expected.DueMs, Version: c.Expected.Version}
			if got == nil || !reflect.DeepEqual(*got, want) {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestCommandsRefuseBadInputNamingTheField(t *testing.T) {
	v := load(t)
	target := v.target(t, "default", nil)
	known := int64(2_000_000_000_000)
	ref := dueflow.JobRef{JobID: "job-1", Queue: "default", IdempotencyKey: "job-1", KnownDueMs: &known}
	long := make([]byte, 65)
	for i := range long {
		long[i] = 'x'
	}
	cases := map[string]func() error{
		"command_id": func() error {
			_, err := dueflow.CancelCommand(ref, 0, 3, target, dueflow.NewJobID, dueflow.CommandID(string(long)))
			return err
		},
		"command_id ": func() error {
			_, err := dueflow.CancelCommand(ref, 0, 3, target, dueflow.NewJobID, dueflow.CommandID("a\x1bb"))
			return err
		},
		"run_at": func() error {
			_, err := dueflow.MoveCommand(ref, known-1, 0, 3, target, dueflow.NewJobID)
			return err
		},
		"run_at ": func() error {
			_, err := dueflow.MoveCommand(ref, dueflow.MaxDueMs+1, 0, 3, target, dueflow.NewJobID)
			return err
		},
		"queue": func() error {
			_, err := dueflow.CancelCommand(dueflow.Ref("no such", "j"), 0, 3, target, dueflow.NewJobID)
			return err
		},
		"idempotency_key": func() error {
			r := ref
			r.IdempotencyKey = ""
			_, err := dueflow.CancelCommand(r, 0, 3, target, dueflow.NewJobID)
			return err
		},
		"payload": func() error {
			_, err := dueflow.PatchCommand(ref, dueflow.Bytes(make([]byte, target.MaxRecordBytes)), 0, 3, target, dueflow.NewJobID)
			return err
		},
	}
	for name, f := range cases {
		var bad *dueflow.InvalidInputError
		if err := f(); !errors.As(err, &bad) || bad.Field+" " != name && bad.Field != name {
			t.Errorf("%s: got %v", name, err)
		}
	}
	// a drawn id is a UUIDv7 of the command's time, as the SDK draws it
	cmd, err := dueflow.CancelCommand(ref, 1_900_000_000_123, 3, target, dueflow.NewJobID)
	if err != nil || len(cmd.ID) != 32 || cmd.ID[:13] != dueflow.UUID7(1_900_000_000_123, [10]byte{})[:13] {
		t.Errorf("drawn id %q (%v)", cmd.ID, err)
	}
}
