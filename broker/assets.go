package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// Default limits of the fabric's JetStream assets. The duplicate window
// needs to cover only events in flight around a failure: a node's
// publisher asks the stream for each agent's last stored event before it
// retries, and a restarted node compares its journal with the stream's
// tails. The server keeps every event id it saw in the window, so the
// window times the event rate is memory (2 minutes at 20,000 events/s
// held about 1 GB).
const (
	DefaultMaxAge     = 7 * 24 * time.Hour
	DefaultMaxBytes   = 4 << 30 // 4 GiB
	DefaultDuplicates = 30 * time.Second
	DefaultNodeTTL    = 15 * time.Second
	// DefaultReposMaxBytes bounds the repositories' object store: four
	// bundles of the largest a client sends or fetches.
	DefaultReposMaxBytes = 8 << 30 // 8 GiB
	// PermitsMaxBytes bounds the permission requests' bucket: 64 agents'
	// most (schemas.MaxPendingPerAgent of schemas.MaxPermitBytes each).
	// Past it a new request is refused (discard-new), none dropped.
	PermitsMaxBytes = 1 << 30 // 1 GiB
)

// Assets are the limits of the stream and buckets the fabric provisions.
// The zero value means the defaults.
type Assets struct {
	// MaxAge drops events older than this; DefaultMaxAge when zero, no
	// age limit when negative.
	MaxAge time.Duration
	// MaxBytes drops the oldest events beyond this size; DefaultMaxBytes
	// when zero, no size limit when negative.
	MaxBytes int64
	// Duplicates is the window in which a republished Nats-Msg-Id is
	// recognised and dropped; DefaultDuplicates when zero.
	Duplicates time.Duration
	// Replicas is the copies kept of the stream and buckets; 1 when zero.
	Replicas int
	// NodeTTL is how long a node's heartbeat entry lives; DefaultNodeTTL
	// when zero.
	NodeTTL time.Duration
	// ReposMaxBytes bounds the repositories' object store (bundles kept
	// ReposTTL): a bundle that would pass it is refused, nothing older is
	// dropped. DefaultReposMaxBytes when zero, no limit when negative.
	ReposMaxBytes int64
}

func (a Assets) withDefaults() Assets {
	if a.MaxAge == 0 {
		a.MaxAge = DefaultMaxAge
	}
	if a.MaxBytes == 0 {
		a.MaxBytes = DefaultMaxBytes
	}
	if a.Duplicates == 0 {
		a.Duplicates = DefaultDuplicates
	}
	if a.Replicas == 0 {
		a.Replicas = 1
	}
	if a.NodeTTL == 0 {
		a.NodeTTL = DefaultNodeTTL
	}
	if a.ReposMaxBytes == 0 {
		a.ReposMaxBytes = DefaultReposMaxBytes
	}
	return a
}

func (a Assets) validate() error {
	switch {
	case a.MaxAge > 0 && a.MaxAge < a.Duplicates:
		return fmt.Errorf("stream max age %s is shorter than the duplicate window %s", a.MaxAge, a.Duplicates)
	case a.Duplicates < 0:
		return fmt.Errorf("duplicate window %s is negative", a.Duplicates)
	case a.Replicas < 1 || a.Replicas > 5:
		return fmt.Errorf("replicas %d is out of range (1-5)", a.Replicas)
	case a.NodeTTL < time.Second:
		return fmt.Errorf("node TTL %s is shorter than a second", a.NodeTTL)
	}
	return nil
}

// StreamConfig returns the configuration of the AGENTS stream.
func (a Assets) StreamConfig() jetstream.StreamConfig {
	a = a.withDefaults()
	maxAge := a.MaxAge
	if maxAge < 0 {
		maxAge = 0
	}
	maxBytes := a.MaxBytes
	if maxBytes < 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        schemas.StreamName,
		Description: "Shoal agent events: agent.<id>, Kaimon's {kind, turn, data} envelope",
		Subjects:    []string{schemas.EventSubjects, schemas.BatchEndSubject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      maxAge,
		MaxBytes:    maxBytes,
		MaxMsgs:     -1,
		Duplicates:  a.Duplicates,
		Replicas:    a.Replicas,
		AllowDirect: true,
		// Nodes publish their events in fast batches (nats-server 2.14
		// and later); a server that does not know the setting leaves it
		// off, and nodes then publish event by event.
		AllowBatchPublish: true,
	}
}

// ReposTTL is how long a bundle stays in the repositories' object store:
// long enough for a node to read it and a caller to fetch an agent's
// work, which a node makes again on each fetch.
const ReposTTL = 24 * time.Hour

// JobsTTL is how long a job's record is kept after its last write.
const JobsTTL = 30 * 24 * time.Hour

// Provision creates or updates the AGENTS stream and the KV buckets on a
// JetStream deployment, embedded or not. It is idempotent. While the
// JetStream cluster elects a leader it retries until ctx ends.
func Provision(ctx context.Context, js jetstream.JetStream, a Assets) error {
	a = a.withDefaults()
	if err := a.validate(); err != nil {
		return err
	}
	steps := []struct {
		what string
		do   func(context.Context) error
	}{
		{"stream " + schemas.StreamName, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateStream(ctx, a.StreamConfig())
			return err
		}},
		{"KV bucket " + schemas.AgentsBucket, func(ctx context.Context) error {
			cfg := jetstream.KeyValueConfig{
				Bucket:      schemas.AgentsBucket,
				Description: "Shoal agent records: agent id -> agent_status, written by the owner node",
				History:     4,
				Storage:     jetstream.FileStorage,
				Replicas:    a.Replicas,
				// Takes per-message TTLs: a forgotten agent's marker
				// goes with its events (client.ForgetRecord). The
				// setting is the least TTL the server lets a message
				// have (it raises any below it), and the TTL of the
				// markers it leaves where a key's last message went.
				LimitMarkerTTL: time.Second,
			}
			_, err := js.CreateOrUpdateKeyValue(ctx, cfg)
			if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
				cfg.LimitMarkerTTL = 0 // a server before 2.11: markers kept for good
				_, err = js.CreateOrUpdateKeyValue(ctx, cfg)
			}
			return err
		}},
		{"KV bucket " + schemas.PermitsBucket, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:       schemas.PermitsBucket,
				Description:  "Shoal permission requests agents wait on, and their answers: <agent>.<request> -> the request",
				History:      1,
				TTL:          7 * 24 * time.Hour,
				MaxBytes:     PermitsMaxBytes,
				MaxValueSize: schemas.MaxPermitBytes + 4<<10, // and the headers
				Storage:      jetstream.FileStorage,
				Replicas:     a.Replicas,
			})
			return err
		}},
		{"KV bucket " + schemas.NodesBucket, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:         schemas.NodesBucket,
				Description:    "Shoal nodes: capabilities, load and heartbeat; an entry expires when its node goes quiet",
				History:        1,
				TTL:            a.NodeTTL,
				LimitMarkerTTL: a.NodeTTL,
				MaxValueSize:   schemas.MaxNodeRecordBytes + 4<<10, // and the headers
				Storage:        jetstream.FileStorage,
				Replicas:       a.Replicas,
			})
			return err
		}},
		{"KV bucket " + schemas.BudgetsBucket, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:      schemas.BudgetsBucket,
				Description: "Shoal budgets: agent id -> what its turns may use, written by the coordinator's side, read by its node",
				History:     1,
				Storage:     jetstream.FileStorage,
				Replicas:    a.Replicas,
			})
			return err
		}},
		{"KV bucket " + schemas.JobsBucket, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:      schemas.JobsBucket,
				Description: "Shoal jobs (shoal job, agent_job): job id -> its record, written by the job's runner",
				History:     1,
				TTL:         JobsTTL,
				Storage:     jetstream.FileStorage,
				Replicas:    a.Replicas,
			})
			return err
		}},
		{"object store " + schemas.ReposBucket, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
				Bucket:      schemas.ReposBucket,
				Description: "Shoal repository bundles: what a caller sends a node of its repository, and what a node sends back of an agent's work",
				TTL:         ReposTTL,
				MaxBytes:    max(a.ReposMaxBytes, -1),
				Storage:     jetstream.FileStorage,
				Replicas:    a.Replicas,
				Compression: true,
			})
			return err
		}},
	}
	for _, s := range steps {
		if err := retryUnavailable(ctx, s.do); err != nil {
			return fmt.Errorf("provision %s: %w", s.what, err)
		}
	}
	return nil
}

// retryUnavailable runs do until it succeeds, fails for a reason other
// than JetStream being briefly unavailable, or ctx ends.
//
// An attempt waits a quarter of a second at first, then twice as long
// each time, up to 5 s: a cluster's JetStream API leaves a request
// unanswered while the members elect a meta leader, and when members
// starting together create the same stream at once all but one of them
// go unanswered (the one answered creates it for all). With a fixed 5 s
// wait a three-member cluster took 25 s to start; the requests are
// idempotent, so asking again soon costs nothing.
func retryUnavailable(ctx context.Context, do func(context.Context) error) error {
	delay, wait := 50*time.Millisecond, 250*time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, wait)
		err := do(attempt)
		cancel()
		if err == nil || !transient(err) {
			return err
		}
		wait = min(2*wait, 5*time.Second)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// errNoPeers is JetStream's "no suitable peers for placement": a
// replicated asset asked for before the meta leader has heard from
// enough members. Members starting together see it until the others
// have reported in.
const errNoPeers jetstream.ErrorCode = 10005

func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.ErrorCode == errNoPeers
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}
