package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/workspace"
)

// Jobs (shoal job, agent_job): an agent opened on a caller's repository
// runs a prompt and its follow-ups, its work comes back as a branch, and
// it is closed. Whoever runs the job keeps its record in
// schemas.JobsBucket, so another process can follow it (shoal job wait,
// shoal job ls); the record's id is the job's agent's.

// JobSpec is a job to run.
type JobSpec struct {
	// Open is how and where its agent is opened; Open.ID, when set, is
	// the job's id.
	Open   schemas.OpenRequest
	Source RepoSource
	// Turns are the prompt and its follow-ups, run in order, each once the
	// one before ended well.
	Turns []string
	// TurnTimeout bounds each turn; schemas.DefaultRunTimeout when zero.
	TurnTimeout time.Duration
	// Started, when set, is called once the job's record is stored.
	Started func(id string)
}

// RunJob runs spec and returns its record as it ended. The error is nil
// only when the job succeeded: it says why the job failed, or why it
// could not be run.
func (f *Direct) RunJob(ctx context.Context, spec JobSpec) (schemas.JobRecord, error) {
	if len(spec.Turns) == 0 {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeInvalid, "a job needs a prompt")
	}
	if slices.ContainsFunc(spec.Turns, func(t string) bool { return strings.TrimSpace(t) == "" }) {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeInvalid, "a job's turns may not be empty")
	}
	if spec.Source.Dir == "" {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeInvalid, "a job needs a repository")
	}
	id := spec.Open.ID
	if id == "" {
		id = schemas.NewAgentID()
	} else if err := schemas.ValidID(id); err != nil {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeInvalid, "job %v", err)
	}
	timeout := spec.TurnTimeout
	if timeout <= 0 {
		timeout = schemas.DefaultRunTimeout
	}
	repo, err := filepath.Abs(spec.Source.Dir)
	if err != nil {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	// A repository that cannot be worked on is the command's mistake,
	// said before the job is stored: one stored has begun (shoal job
	// --detach answers once it sees the record).
	start, err := prepareRepo(ctx, spec.Source)
	if err != nil {
		return schemas.JobRecord{}, err
	}
	defer start.Close()
	if err := start.BranchBlocked(ctx, schemas.BranchName(id)); err != nil {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	f.sayLeftOut(start)
	kv, err := f.js.KeyValue(ctx, schemas.JobsBucket)
	if err != nil {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.JobsBucket, err)
	}
	host, _ := os.Hostname()
	now := unixSeconds(time.Now())
	w := &jobWriter{kv: kv, rec: schemas.JobRecord{ID: id, Status: schemas.JobRunning, Repo: repo, Runner: host,
		Turns: spec.Turns, StartedAt: now, Beat: now}}
	b, _ := json.Marshal(w.rec)
	if _, err := kv.Create(ctx, id, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return schemas.JobRecord{}, schemas.Errf(schemas.CodeConflict, "job %s exists already (shoal job wait %s follows it)", id, id)
		}
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeUnavailable, "store job %s: %v", id, err)
	}
	if spec.Started != nil {
		spec.Started(id)
	}
	beatCtx, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	var beating sync.WaitGroup
	beating.Go(func() { w.beat(beatCtx) })
	defer func() { stopBeat(); beating.Wait() }()

	failed := f.workJob(ctx, w, spec, start, id, timeout)
	w.write(context.WithoutCancel(ctx), func(j *schemas.JobRecord) {
		j.Status, j.EndedAt = schemas.JobSucceeded, unixSeconds(time.Now())
		if failed != nil {
			j.Status, j.Error = schemas.JobFailed, failed.Error()
		}
	})
	return w.record(), failed
}

// workJob opens the job's agent, runs its turns, fetches its work and
// closes it, writing each step into the record; it says why the job
// failed, or nil.
func (f *Direct) workJob(ctx context.Context, w *jobWriter, spec JobSpec, start *workspace.Start, id string, timeout time.Duration) error {
	req := spec.Open
	req.ID = id
	opened, err := f.openPrepared(ctx, req, start)
	if err != nil {
		return fmt.Errorf("open its agent: %w", err)
	}
	w.write(ctx, func(j *schemas.JobRecord) { j.Node = opened.Node })
	closed := false
	closeAgent := func() {
		if !closed {
			closed = true
			f.Close(context.WithoutCancel(ctx), schemas.AgentRequest{AgentID: id})
		}
	}
	defer closeAgent()
	var failed error
	for i, text := range spec.Turns {
		rep, err := f.Run(ctx, schemas.RunRequest{AgentID: id, Text: text, Timeout: timeout.Seconds()})
		if err == nil {
			err = f.turnFailure(ctx, id, rep)
		}
		if err != nil {
			failed = fmt.Errorf("turn %d of %d: %w", i+1, len(spec.Turns), err)
			break
		}
		w.write(ctx, func(j *schemas.JobRecord) { j.Done = i + 1 })
	}
	// The work is brought back whether the turns went well or not.
	fctx := context.WithoutCancel(ctx)
	got, err := f.Fetch(fctx, id, "", false)
	if err != nil {
		if failed != nil {
			return fmt.Errorf("%w; and its work could not be fetched: %v", failed, err)
		}
		return fmt.Errorf("fetch its work: %w", err)
	}
	stat, _ := f.Diff(fctx, id, true)
	closeAgent()
	rec, err := f.Record(fctx, id)
	w.write(fctx, func(j *schemas.JobRecord) {
		j.Branch, j.Tip, j.Commits, j.Files, j.Stat = got.Branch, got.Tip, got.Commits, got.Files, stat.Diff
		if err == nil {
			j.Usage = &rec.Usage
		}
	})
	return failed
}

// turnFailure says why the turn rep answered did not end well: an error
// event in it, or a stop other than the end of its turn; nil when it did.
func (f *Direct) turnFailure(ctx context.Context, id string, rep schemas.RunReply) error {
	if err := TurnError(ctx, f, id, rep.Turn); err != nil {
		return err
	}
	if rep.StopReason != "" && rep.StopReason != schemas.StopEndTurn {
		return fmt.Errorf("the turn stopped: %s", rep.StopReason)
	}
	return nil
}

// ErrTurnFailed is a turn's error event, as TurnError returns it.
var ErrTurnFailed = errors.New("the turn failed")

// TurnError is the error event of agent id's turn (a model's refusal, a
// CLI that failed), as "the turn failed: <its message>" (ErrTurnFailed),
// or nil when the turn had none, or why its events could not be read.
func TurnError(ctx context.Context, c Client, id string, turn int) error {
	page, err := c.Events(ctx, schemas.EventsRequest{AgentID: id, FromTurn: turn, Max: 5000})
	if err != nil {
		return fmt.Errorf("the turn's events cannot be read: %w", err)
	}
	for _, se := range page.Events {
		ev, err := schemas.Decode(se.Event)
		if err != nil || ev.Turn != turn {
			continue
		}
		if e, ok := ev.Payload.(schemas.Error); ok {
			return fmt.Errorf("%w: %s", ErrTurnFailed, e.Message)
		}
	}
	return nil
}

// jobWriter keeps a running job's record: its runner is its one writer.
type jobWriter struct {
	kv  jetstream.KeyValue
	mu  sync.Mutex
	rec schemas.JobRecord
}

// write changes the record and stores it, with a fresh beat.
func (w *jobWriter) write(ctx context.Context, change func(*schemas.JobRecord)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	change(&w.rec)
	w.rec.Beat = unixSeconds(time.Now())
	b, _ := json.Marshal(w.rec)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w.kv.Put(wctx, w.rec.ID, b) // a missed write is made good by the next beat
}

// beat writes the record every schemas.JobBeatSeconds until ctx ends,
// so that readers can tell a running job from a lost one.
func (w *jobWriter) beat(ctx context.Context) {
	t := time.NewTicker(schemas.JobBeatSeconds * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.write(ctx, func(*schemas.JobRecord) {})
		}
	}
}

func (w *jobWriter) record() schemas.JobRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rec
}

// Job reads job id's record; a running job whose runner has been silent
// for schemas.JobLostAfterSeconds is reported lost.
func (f *Direct) Job(ctx context.Context, id string) (schemas.JobRecord, error) {
	if err := validAgent(id); err != nil {
		return schemas.JobRecord{}, err
	}
	kv, err := f.js.KeyValue(ctx, schemas.JobsBucket)
	if err != nil {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.JobsBucket, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeNotFound, "no such job: %s", id)
	}
	if err != nil {
		return schemas.JobRecord{}, schemas.Errf(schemas.CodeUnavailable, "read job %s: %v", id, err)
	}
	return decodeJob(e.Value(), time.Now())
}

// Jobs lists every job the fabric keeps, oldest first.
func (f *Direct) Jobs(ctx context.Context) ([]schemas.JobRecord, error) {
	kv, err := f.js.KeyValue(ctx, schemas.JobsBucket)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.JobsBucket, err)
	}
	out := []schemas.JobRecord{}
	now := time.Now()
	if err := eachValue(ctx, kv, func(_ string, v []byte) {
		if j, err := decodeJob(v, now); err == nil {
			out = append(out, j)
		}
	}); err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "list jobs: %v", err)
	}
	slices.SortFunc(out, func(a, b schemas.JobRecord) int {
		if c := compareFloat(a.StartedAt, b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// WaitJob waits until job id has ended, or is lost, and returns its
// record.
//
// A job whose record looks lost is watched a little before it is said to
// be: its runner may be coming back from an outage of the fabric, in
// which it could write nothing, and writes its record within a beat of
// being back. However old its last beat (an outage's length), only the
// watch tells a runner that is back from one that is gone.
func (f *Direct) WaitJob(ctx context.Context, id string) (schemas.JobRecord, error) {
	j, err := f.Job(ctx, id)
	if err != nil || j.Ended() {
		return j, err
	}
	kv, err := f.js.KeyValue(ctx, schemas.JobsBucket)
	if err != nil {
		return j, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.JobsBucket, err)
	}
	watch, err := WatchKeys(ctx, f.nc, kv, id, jetstream.UpdatesOnly())
	if err != nil {
		return j, schemas.Errf(schemas.CodeUnavailable, "watch job %s: %v", id, err)
	}
	defer watch.Stop()
	check := time.NewTicker(schemas.JobBeatSeconds * time.Second)
	defer check.Stop()
	var silent time.Time // since when the job has looked lost
	for {
		// Read again: the job may have ended before the watch began.
		if j, err = f.Job(ctx, id); err != nil || j.Ended() {
			return j, err
		}
		switch {
		case j.Status != schemas.JobLost:
			silent = time.Time{}
		case silent.IsZero():
			silent = time.Now()
		case time.Since(silent) >= jobComeBack:
			return j, nil
		}
		select {
		case <-ctx.Done():
			return j, ctx.Err()
		case <-watch.Updates():
		case <-check.C:
		}
	}
}

// jobComeBack is how long a job that looks lost is watched for its runner
// to write its record again: two of its beats.
const jobComeBack = 2 * schemas.JobBeatSeconds * time.Second

// decodeJob reads a job's record as of now.
func decodeJob(b []byte, now time.Time) (schemas.JobRecord, error) {
	var j schemas.JobRecord
	if err := json.Unmarshal(b, &j); err != nil {
		return j, schemas.Errf(schemas.CodeInternal, "a job record that does not decode: %v", err)
	}
	if j.Status == schemas.JobRunning && unixSeconds(now)-j.Beat > schemas.JobLostAfterSeconds {
		j.Status = schemas.JobLost
	}
	return j, nil
}

func compareFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
