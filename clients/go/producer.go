package dueflow

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hamba/avro/v2/registry"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config says how to reach the cluster and what it looks like.
type Config struct {
	Brokers []string
	// Prefix of the topic names (default "dueflow": dueflow.timers, ...).
	Prefix string
	// Wheel is the cluster's geometry (default DefaultWheel; `dueflow topics describe`).
	Wheel *Wheel
	// NoScheduledOutcomes turns off the "scheduled" outcome per job (the status view's).
	NoScheduledOutcomes bool
	// Retention is the queues' idempotency retention (default 7 days): LegacyCancel
	// and LegacyReschedule refuse a job due beyond it.
	Retention time.Duration
	// SchemaRegistryURL turns on the registry option: job values in the Confluent
	// wire format, with the id the registry gives job.avsc under subject
	// <prefix>.timers-value. Upgrade every worker first.
	SchemaRegistryURL string
	// Clock returns UTC epoch ms (default: time.Now).
	Clock func() int64
	// ClientOpts are more franz-go options (TLS, SASL, client id, ...).
	ClientOpts []kgo.Opt
}

// Producer schedules dueflow jobs, and cancels, reschedules and updates them by
// command, with franz-go: the records of docs/wire-format.md, idempotent,
// acks=all; it reads a command's verdict from the outcomes topic. Safe for
// concurrent use.
type Producer struct {
	client       *kgo.Client
	admin        *kadm.Client
	target       Target
	cfg          Config
	mu           sync.Mutex
	queueSize    map[string]int32
	outcomesSize int32
}

// NewProducer connects and checks that the timer topic has the wheel's partitions.
func NewProducer(ctx context.Context, cfg Config) (*Producer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "dueflow"
	}
	if cfg.Wheel == nil {
		w := DefaultWheel
		cfg.Wheel = &w
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Clock == nil {
		cfg.Clock = func() int64 { return time.Now().UnixMilli() }
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.BasicConsistentPartitioner(partition)),
		kgo.ProducerLinger(0),
	}, cfg.ClientOpts...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, &KafkaError{Op: "connecting", Err: err}
	}
	p := &Producer{client: client, admin: kadm.NewClient(client), cfg: cfg, queueSize: map[string]int32{}}
	p.target = Target{Prefix: cfg.Prefix, Wheel: *cfg.Wheel, MaxRecordBytes: DefaultMaxRecordBytes}
	if err := p.checkTimerTopic(ctx); err != nil {
		client.Close()
		return nil, err
	}
	if cfg.SchemaRegistryURL != "" {
		reg, err := registry.NewClient(cfg.SchemaRegistryURL)
		if err == nil {
			var id int
			id, _, err = reg.CreateSchema(ctx, p.target.timers()+"-value", JobSchemaText)
			sid := int32(id)
			p.target.SchemaID = &sid
		}
		if err != nil {
			client.Close()
			return nil, &KafkaError{Op: "registering job.avsc at " + cfg.SchemaRegistryURL, Err: err, Retriable: true}
		}
	}
	return p, nil
}

// Partition -1: Kafka's default partitioner (murmur2 of the key); else as given.
func partition(topic string) func(r *kgo.Record, n int) int {
	return func(r *kgo.Record, n int) int {
		if r.Partition < 0 {
			return int(KeyPartition(r.Key, int32(n)))
		}
		return int(r.Partition)
	}
}

// SchemaID is the id job values are framed with (nil: plain Avro).
func (p *Producer) SchemaID() *int32 { return p.target.SchemaID }

// Schedule writes the job of req and returns once the broker has its timer. An
// *InvalidInputError (nothing written) names a bad field or a queue that does not exist.
func (p *Producer) Schedule(ctx context.Context, req *Request) (ScheduledJob, error) {
	check := func(q string) error { _, err := p.partitionsOf(ctx, q); return err }
	planned, err := Plan(req, p.cfg.Clock(), p.target, check, NewJobID)
	if err != nil {
		return ScheduledJob{}, err
	}
	if err := p.write(ctx, planned.Timer); err != nil {
		return ScheduledJob{}, &KafkaError{Op: "scheduling job " + planned.Job.JobID, Err: err, Retriable: true}
	}
	if !p.cfg.NoScheduledOutcomes { // for the status view; nobody waits for it (as the SDK)
		p.client.Produce(ctx, toKgo(planned.Outcome), func(*kgo.Record, error) {})
	}
	return planned.Job, nil
}

// Cancel cancels the job ref names by command (a finalized queue; any horizon):
// it never runs, and an attempt running now finishes without another starting.
// It returns once the broker has the command; WaitVerdict waits for the worker's
// verdict (cancelled, or refused).
func (p *Producer) Cancel(ctx context.Context, ref JobRef, opts ...CommandOption) (SentCommand, error) {
	return p.steer(ctx, ref, "cancelling", func(at int64, n int32) (Command, error) {
		return CancelCommand(ref, at, n, p.target, NewJobID, opts...)
	})
}

// Reschedule moves the pending job ref names to at by command (a finalized queue;
// any horizon): it runs then, not before, once. Only later than its due time: to
// run a job earlier, cancel it and schedule it again. The verdict: rescheduled, or
// refused.
func (p *Producer) Reschedule(ctx context.Context, ref JobRef, at time.Time, opts ...CommandOption) (SentCommand, error) {
	return p.RescheduleMs(ctx, ref, at.UnixMilli(), opts...)
}

// RescheduleMs is Reschedule to UTC epoch millisecond dueMs.
func (p *Producer) RescheduleMs(ctx context.Context, ref JobRef, dueMs int64, opts ...CommandOption) (SentCommand, error) {
	return p.steer(ctx, ref, "rescheduling", func(at int64, n int32) (Command, error) {
		return MoveCommand(ref, dueMs, at, n, p.target, NewJobID, opts...)
	})
}

// Update replaces the payload of the pending job ref names with payload (JSON,
// JSONText or Bytes) by command (a finalized queue; any horizon), and with NewDue
// moves it later too: it runs once, with the new payload. The verdict: updated, or
// refused.
func (p *Producer) Update(ctx context.Context, ref JobRef, payload Option, opts ...CommandOption) (SentCommand, error) {
	return p.steer(ctx, ref, "updating", func(at int64, n int32) (Command, error) {
		return PatchCommand(ref, payload, at, n, p.target, NewJobID, opts...)
	})
}

// ErrNoVerdict is what WaitVerdict returns when no verdict came in time: the worker
// of the job's partition is down or behind; the command stays and is applied when
// it gets there.
var ErrNoVerdict = errors.New("no verdict in time")

// WaitVerdict waits up to timeout (or until ctx is done) for the verdict of the
// worker that owns the job's partition on sent: it reads the job id's outcomes
// partition, from where it ended before the command was written, until the outcome
// with the command's id. ErrNoVerdict when none came within timeout.
func (p *Producer) WaitVerdict(ctx context.Context, sent SentCommand, timeout time.Duration) (*Verdict, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	topic := p.target.outcomes()
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
			topic: {sent.OutcomesPartition: kgo.NewOffset().At(sent.OutcomesOffset)},
		}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(50 * time.Millisecond),
	}, p.cfg.ClientOpts...)
	reader, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, &KafkaError{Op: "reading " + topic, Err: err, Retriable: true}
	}
	defer reader.Close()
	for {
		fetches := reader.PollFetches(ctx)
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, ErrNoVerdict
			}
			return nil, ctx.Err()
		}
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) && !errors.Is(fe.Err, context.Canceled) && !kerr.IsRetriable(fe.Err) {
				return nil, &KafkaError{Op: "reading " + topic, Err: fe.Err}
			}
		}
		var found *Verdict
		fetches.EachRecord(func(r *kgo.Record) {
			if found != nil {
				return
			}
			schema := ""
			for _, h := range r.Headers {
				if h.Key == "df-schema" {
					schema = string(h.Value)
				}
			}
			found = VerdictOf(r.Key, r.Value, schema, sent.JobID, sent.CommandID)
		})
		if found != nil {
			return found, nil
		}
	}
}

func (p *Producer) steer(ctx context.Context, ref JobRef, what string, plan func(at int64, partitions int32) (Command, error)) (SentCommand, error) {
	n, err := p.partitionsOf(ctx, ref.Queue)
	if err != nil {
		return SentCommand{}, err
	}
	cmd, err := plan(p.cfg.Clock(), n)
	if err != nil {
		return SentCommand{}, err
	}
	part, offset, err := p.outcomesEnd(ctx, ref.JobID)
	if err != nil {
		return SentCommand{}, err
	}
	if err := p.write(ctx, cmd.Record); err != nil {
		return SentCommand{}, &KafkaError{Op: what + " job " + ref.JobID, Err: err, Retriable: true}
	}
	return SentCommand{
		CommandID: cmd.ID, Op: cmd.Op, JobID: ref.JobID, Queue: ref.Queue, Partition: cmd.Record.Partition,
		OutcomesPartition: part, OutcomesOffset: offset,
	}, nil
}

// outcomesEnd is the partition of jobID in the outcomes topic and its end (last
// stable offset) now.
func (p *Producer) outcomesEnd(ctx context.Context, jobID string) (int32, int64, error) {
	topic := p.target.outcomes()
	p.mu.Lock()
	n := p.outcomesSize
	p.mu.Unlock()
	if n == 0 {
		details, err := p.admin.ListTopics(ctx, topic)
		if err != nil {
			return 0, 0, &KafkaError{Op: "describing " + topic, Err: err, Retriable: true}
		}
		d, found := details[topic]
		if !found || d.Err != nil || len(d.Partitions) == 0 {
			return 0, 0, &KafkaError{Op: "outcomes topic " + topic + " not usable (run `dueflow topics ensure`?)", Err: fmt.Errorf("%v", d.Err)}
		}
		n = int32(len(d.Partitions))
		p.mu.Lock()
		p.outcomesSize = n
		p.mu.Unlock()
	}
	part := KeyPartition([]byte(jobID), n)
	ends, err := p.admin.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return 0, 0, &KafkaError{Op: "end offsets of " + topic, Err: err, Retriable: true}
	}
	end, ok := ends.Lookup(topic, part)
	if !ok || end.Err != nil {
		return 0, 0, &KafkaError{Op: "end offset of " + topic, Err: fmt.Errorf("partition %d: %v", part, end.Err), Retriable: true}
	}
	return part, end.Offset, nil
}

// LegacyCancel cancels job with the legacy records, for a queue not finalized (its
// workers may be of a release before commands): workers skip it (and its retries)
// if it has not run yet. Refused for a job due beyond the queue's idempotency
// retention (7 days by default) less an hour.
func (p *Producer) LegacyCancel(ctx context.Context, job ScheduledJob) error {
	n, err := p.partitionsOf(ctx, job.Queue)
	if err != nil {
		return err
	}
	records, err := LegacyCancelRecords(&job, p.cfg.Clock(), n, p.target, p.cfg.Retention)
	if err != nil {
		return err
	}
	return p.writeAll(ctx, records, "cancelling job "+job.JobID)
}

// LegacyReschedule moves pending job to at with the legacy records, for a queue not
// finalized: it runs then, never at its old time, never twice. Refused beyond the
// idempotency retention.
func (p *Producer) LegacyReschedule(ctx context.Context, job ScheduledJob, at time.Time) (ScheduledJob, error) {
	return p.LegacyRescheduleMs(ctx, job, at.UnixMilli())
}

// LegacyRescheduleMs is LegacyReschedule to UTC epoch millisecond dueMs.
func (p *Producer) LegacyRescheduleMs(ctx context.Context, job ScheduledJob, dueMs int64) (ScheduledJob, error) {
	n, err := p.partitionsOf(ctx, job.Queue)
	if err != nil {
		return ScheduledJob{}, err
	}
	records, err := LegacyRescheduleRecords(&job, dueMs, p.cfg.Clock(), n, p.target, p.cfg.Retention)
	if err != nil {
		return ScheduledJob{}, err
	}
	if err := p.writeAll(ctx, records, "rescheduling job "+job.JobID); err != nil {
		return ScheduledJob{}, err
	}
	job.DueMs, job.Partition = dueMs, records[0].Partition
	return job, nil
}

// Close writes what is pending (scheduled outcomes) and disconnects.
func (p *Producer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = p.client.Flush(ctx)
	p.client.Close()
}

func (p *Producer) writeAll(ctx context.Context, records []Record, what string) error {
	for _, r := range records { // in order: each acknowledged before the next
		if err := p.write(ctx, r); err != nil {
			return &KafkaError{Op: what + " (" + r.Topic + ")", Err: err, Retriable: true}
		}
	}
	return nil
}

func (p *Producer) write(ctx context.Context, r Record) error {
	return p.client.ProduceSync(ctx, toKgo(r)).FirstErr()
}

func toKgo(r Record) *kgo.Record {
	rec := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
	}
	return rec
}

// partitionsOf is the partition count of queue's exec topic; an *InvalidInputError
// when the queue has none.
func (p *Producer) partitionsOf(ctx context.Context, queue string) (int32, error) {
	if err := checkQueue(queue); err != nil {
		return 0, err
	}
	p.mu.Lock()
	n, ok := p.queueSize[queue]
	p.mu.Unlock()
	if ok {
		return n, nil
	}
	topic := p.target.exec(queue)
	details, err := p.admin.ListTopics(ctx, topic)
	if err != nil {
		return 0, &KafkaError{Op: "describing " + topic, Err: err, Retriable: true}
	}
	d, found := details[topic]
	if !found || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return 0, invalid("queue", queue, fmt.Sprintf(
			"a queue that exists (no topic %s); to create it: `dueflow queue create %s --partitions N` (docs/queues.md)", topic, queue))
	}
	if d.Err != nil {
		return 0, &KafkaError{Op: "describing " + topic, Err: d.Err, Retriable: true}
	}
	n = int32(len(d.Partitions))
	p.mu.Lock()
	p.queueSize[queue] = n
	p.mu.Unlock()
	return n, nil
}

func (p *Producer) checkTimerTopic(ctx context.Context) error {
	topic := p.target.timers()
	details, err := p.admin.ListTopics(ctx, topic)
	if err != nil {
		return &KafkaError{Op: "describing " + topic, Err: err, Retriable: true}
	}
	d, found := details[topic]
	if !found || d.Err != nil {
		return &KafkaError{Op: "timer topic " + topic + " not usable (run `dueflow topics ensure`?)", Err: fmt.Errorf("%v", d.Err)}
	}
	n, shard := int64(len(d.Partitions)), p.target.Wheel.ShardPartitions()
	if n < p.target.Wheel.TotalPartitions() || n%shard != 0 {
		return &KafkaError{Op: "checking " + topic, Err: fmt.Errorf(
			"%d partitions, but the wheel %+v needs %d (a multiple of %d): give the cluster's geometry (dueflow topics describe)",
			n, p.target.Wheel, p.target.Wheel.TotalPartitions(), shard)}
	}
	configs, err := p.admin.DescribeTopicConfigs(ctx, topic)
	if err == nil {
		if rc, err := configs.On(topic, nil); err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" && c.Value != nil {
					if v, err := strconv.Atoi(*c.Value); err == nil {
						p.target.MaxRecordBytes = v
					}
				}
			}
		}
	}
	return nil
}
