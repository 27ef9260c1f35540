package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// The floor: the shortest path this machine gives from a CLI's line to
// the stream, measured beside the node in the same run. A floor round
// starts as many stand-ins as the node's round has agents, with the same
// --events and --rate, sends each a turn, reads each one's stdout in a
// goroutine of its own and hands every delta to one publisher that sends
// it straight to JetStream the node's way (fast batches, or an async
// publish per event with --publish async), in a process of its own as the
// node is (FloorArg), on one connection, under the node's three headers
// (a message id among them), as an envelope of the node's own shape
// carrying the line's text. It does nothing else: no decoding beyond
// finding the text, no journal, no outbox, no state kept but the next
// message id. Every bare round has one, and in a paced run every watched
// round too, right after the node's round.
//
// Its events/s (first turn sent to last publish acknowledged) is the
// anchor that pays for the same stand-ins the node reads: the four
// anchors publish envelopes already made, with no CLI printing them. Its
// latency from each line's print to stored, and to the live Kaimon bus in
// the watched rounds, is what the node's latency is read against:
// whatever of the node's tail the floor has too is the machine's (waking
// a reader for a pipe, scheduling the server), not the node's.
type floor struct {
	url     string
	exe     string
	publish string // the node's way: batches or async
	events  int
	rate    float64
	pub     *rawBaseline
	stream  jetstream.Stream
	before  []byte // a captured delta envelope up to its text
	after   []byte // and from the end of its text

	stored samples
	bus    samples
	// The deltas its rounds published, and the time they took, each from
	// its first turn sent to its last publish acknowledged.
	published int64
	took      time.Duration
}

// throughput is the floor's events/s over its rounds.
func (fl *floor) throughput() float64 {
	if fl.took <= 0 {
		return 0
	}
	return float64(fl.published) / fl.took.Seconds()
}

// newFloor is a floor publishing as node to an agent subject of its own,
// the way publish names (shoal node --publish: batches or async), its
// envelopes shaped as the delta envelope among envelopes.
func newFloor(ctx context.Context, url, node, exe, publish string, events int, rate float64, envelopes [][]byte) (*floor, error) {
	var before, after []byte
	for _, env := range envelopes {
		if i := bytes.Index(env, []byte(`"text":"s`)); i >= 0 {
			if j := bytes.IndexByte(env[i+len(`"text":"`):], '"'); j >= 0 {
				before = env[:i+len(`"text":"`)]
				after = env[i+len(`"text":"`)+j:]
				break
			}
		}
	}
	if before == nil {
		return nil, errors.New("the floor: no delta envelope of the node's to take its shape from")
	}
	pub, err := dialBaseline(url, AnchorAsyncDedup, node, "floor")
	if err != nil {
		return nil, fmt.Errorf("the floor: %w", err)
	}
	stream, err := pub.js.Stream(ctx, schemas.StreamName)
	if err != nil {
		pub.close()
		return nil, fmt.Errorf("the floor: open stream %s: %w", schemas.StreamName, err)
	}
	return &floor{url: url, exe: exe, publish: cmp.Or(publish, "batches"), events: events, rate: rate, pub: pub, stream: stream, before: before, after: after}, nil
}

// channel is the floor's channel on the Kaimon bus.
func (fl *floor) channel() string { return "agent:" + fl.pub.id }

func (fl *floor) close() { fl.pub.close() }

// FloorArg is the hidden subcommand that runs a floor round in a process
// of its own, as a node is one: its reader's wake-ups and the server's are
// then in two processes, as the node's are.
//
//	shoal __floor --nats URL --id ID --node NODE --first N --agents N --events N [--rate R] [--publish batches|async] --before B64 --after B64
//
// Once every event is acknowledged it prints the number of the last one
// and the round's time in nanoseconds, from its first turn sent.
const FloorArg = "__floor"

// round runs n stand-ins' turns through a floor process and adds each
// delta's latency to stored once the stream holds them all.
func (fl *floor) round(ctx context.Context, n int) error {
	info, err := fl.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("the floor: the stream's last sequence: %w", err)
	}
	// A stand-in that stops printing must not hold the run for ever.
	limit := 2 * time.Minute
	if fl.rate > 0 {
		limit += 2 * time.Duration(float64(fl.events)/fl.rate*float64(time.Second))
	}
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	first := fl.pub.next
	cmd := exec.CommandContext(rctx, fl.exe, FloorArg, "--nats", fl.url, "--id", fl.pub.id, "--node", fl.pub.node,
		"--first", strconv.Itoa(first), "--agents", strconv.Itoa(n), "--events", strconv.Itoa(fl.events),
		"--rate", strconv.FormatFloat(fl.rate, 'f', -1, 64), "--publish", fl.publish,
		"--before", base64.StdEncoding.EncodeToString(fl.before), "--after", base64.StdEncoding.EncodeToString(fl.after))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if rctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("the floor's process did not end in %s: %s", limit, bytes.TrimSpace(stderr.Bytes()))
	}
	if err != nil {
		return fmt.Errorf("the floor's process: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var last int
	var took time.Duration
	if _, err := fmt.Sscan(string(out), &last, &took); err != nil {
		return fmt.Errorf("the floor's process answered %q, not its last event's number and its time: %v", out, err)
	}
	if want := n * fl.events; last-first+1 != want || took <= 0 {
		return fmt.Errorf("the floor's process published events %d to %d in %s; want %d events", first, last, took, want)
	}
	fl.pub.next = last + 1
	fl.published += int64(last - first + 1)
	fl.took += took
	return fl.readBack(ctx, info.State.LastSeq+1, last-first+1)
}

// RunFloor runs a floor round (FloorArg's arguments) and returns the exit
// code.
func RunFloor(args []string) int {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "%s: "+format+"\n", append([]any{FloorArg}, a...)...)
		return code
	}
	fs := flag.NewFlagSet(FloorArg, flag.ContinueOnError)
	url := fs.String("nats", "", "the fabric's URL")
	id := fs.String("id", "", "the agent id its events are published as")
	node := fs.String("node", "", "the node they name")
	first := fs.Int("first", 1, "the number of the first event")
	agents := fs.Int("agents", 1, "stand-ins")
	events := fs.Int("events", 0, "deltas per stand-in")
	rate := fs.Float64("rate", 0, "deltas per second per stand-in (0: as fast as it can)")
	publish := fs.String("publish", "batches", "batches or async")
	before := fs.String("before", "", "the envelope before the text, base64")
	after := fs.String("after", "", "the envelope after the text, base64")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case *url == "" || *id == "" || *node == "":
		return fail(2, "--nats, --id and --node are needed")
	case *first < 1 || *agents < 1 || *events < 1 || *rate < 0:
		return fail(2, "--first %d, --agents %d, --events %d: at least 1 each; --rate %v: not negative", *first, *agents, *events, *rate)
	case *publish != "batches" && *publish != "async":
		return fail(2, "--publish %q: batches or async", *publish)
	}
	b, err1 := base64.StdEncoding.DecodeString(*before)
	a, err2 := base64.StdEncoding.DecodeString(*after)
	if err := errors.Join(err1, err2); err != nil || len(b) == 0 {
		return fail(2, "--before and --after: an envelope's two parts in base64: %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(1, "%v", err)
	}
	pub, err := dialBaseline(*url, AnchorAsyncDedup, *node, "floor")
	if err != nil {
		return fail(1, "%v", err)
	}
	defer pub.close()
	pub.id, pub.next = *id, *first
	fl := &floor{exe: exe, publish: *publish, events: *events, rate: *rate, pub: pub, before: b, after: a}
	if err := fl.publishRound(*agents); err != nil {
		return fail(1, "%v", err)
	}
	fmt.Println(pub.next-1, int64(fl.took))
	return 0
}

// publishRound runs n stand-ins' turns, reading each in a goroutine of
// its own that hands each delta's envelope to one publisher, as the
// node's readers hand their events to its one publisher; it returns once
// every publish is acknowledged, fl.took the time from the first turn
// sent.
func (fl *floor) publishRound(n int) error {
	type standin struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	ss := make([]standin, n)
	defer func() {
		for _, s := range ss {
			if s.cmd != nil && s.cmd.Process != nil {
				s.in.Close()
				s.cmd.Process.Kill()
				s.cmd.Wait()
			}
		}
	}()
	for i := range ss {
		cmd := exec.Command(fl.exe, StandinArg, "--events", strconv.Itoa(fl.events), "--rate", strconv.FormatFloat(fl.rate, 'f', -1, 64))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("stand-in %d: %w", i, err)
		}
		ss[i] = standin{cmd, in, bufio.NewReaderSize(out, 16<<10)}
	}
	// Every stand-in answers a control request before the clock starts,
	// as the node's have run before its rounds.
	for i, s := range ss {
		if _, err := io.WriteString(s.in, `{"type":"control_request","request_id":"ready"}`+"\n"); err != nil {
			return fmt.Errorf("stand-in %d: %w", i, err)
		}
		line, err := s.out.ReadSlice('\n')
		if err != nil || !bytes.HasPrefix(line, []byte(`{"type":"control_response"`)) {
			return fmt.Errorf("stand-in %d did not answer a control request: %q %v", i, line, err)
		}
	}
	publish, done, err := fl.publisher()
	if err != nil {
		return err
	}
	envs := make(chan []byte, 1024)
	sent := make(chan error, 1)
	go func() {
		var first error
		for env := range envs {
			if first == nil {
				first = publish(env)
			}
		}
		sent <- first
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i, s := range ss {
		if _, err := io.WriteString(s.in, `{"type":"user","message":{"role":"user","content":"floor"}}`+"\n"); err != nil {
			// The readers begun end with their turns; envs closes after them.
			errs <- fmt.Errorf("stand-in %d: %w", i, err)
			break
		}
		wg.Go(func() {
			if err := fl.read(s.out, envs); err != nil {
				errs <- fmt.Errorf("stand-in %d (pid %d): %w", i, s.cmd.Process.Pid, err)
			}
		})
	}
	wg.Wait()
	close(envs)
	close(errs)
	if err := errors.Join(<-sent, <-errs); err != nil {
		return err
	}
	if err := done(); err != nil {
		return err
	}
	fl.took = time.Since(start)
	return nil
}

// publisher is the floor's way of publishing an envelope, the node's
// (fast batches or async), and what waits for every acknowledgement and
// says the first failure.
func (fl *floor) publisher() (publish func([]byte) error, done func() error, err error) {
	var failed atomic.Value
	if fl.publish == "async" {
		js, err := jetstream.New(fl.pub.conn, jetstream.WithPublishAsyncMaxPending(512),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) { failed.CompareAndSwap(nil, err) }))
		if err != nil {
			return nil, nil, err
		}
		publish = func(env []byte) error {
			_, err := js.PublishMsgAsync(fl.pub.msg(env), jetstream.WithStallWait(time.Minute))
			return err
		}
		done = func() error {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				return errors.New("publishes not acknowledged in a minute")
			}
			if err, _ := failed.Load().(error); err != nil {
				return fmt.Errorf("a publish failed: %w", err)
			}
			return nil
		}
		return publish, done, nil
	}
	b, err := newFastBatch(fl.pub.js)
	if err != nil {
		return nil, nil, fmt.Errorf("a fast batch: %w", err)
	}
	publish = func(env []byte) error { return b.add(fl.pub.msg(env)) }
	done = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return b.end(ctx)
	}
	return publish, done, nil
}

// read hands every delta a stand-in prints, as an envelope, to envs,
// until its result.
func (fl *floor) read(r *bufio.Reader, envs chan<- []byte) error {
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("a line longer than %d bytes", r.Size())
		}
		if err != nil {
			return fmt.Errorf("ended before its result: %w", err)
		}
		if bytes.HasPrefix(line, []byte(`{"type":"result"`)) {
			return nil
		}
		i := bytes.Index(line, []byte(`"text":"`))
		if i < 0 {
			continue
		}
		text := line[i+len(`"text":"`):]
		j := bytes.IndexByte(text, '"')
		if j < 0 {
			continue
		}
		env := make([]byte, 0, len(fl.before)+j+len(fl.after))
		envs <- append(append(append(env, fl.before...), text[:j]...), fl.after...)
	}
}

// readBack reads the floor's want events from the stream, from sequence
// from on, and adds each one's latency from its print to its storing.
func (fl *floor) readBack(ctx context.Context, from uint64, want int) error {
	c, err := fl.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{schemas.EventSubject(fl.pub.id)}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("read the floor's events back: %w", err)
	}
	for seen := 0; seen < want; {
		batch, err := c.Fetch(min(4096, want-seen), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read the floor's events back: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("read the floor's events back: %w", err)
			}
			if _, printed, ok := stamp(m.Data()); ok {
				fl.stored.add(md.Timestamp.UnixNano() - printed)
			}
		}
		seen += got
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read the floor's events back: %w", err)
		}
		if got == 0 {
			return fmt.Errorf("read the floor's events back: %d of %d in the stream", seen, want)
		}
	}
	return nil
}
