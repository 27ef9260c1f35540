package bench

import (
	"bufio"
	"bytes"
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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// The floor: the shortest path this machine gives from a CLI's line to
// the stream, measured beside the node in the same run. A floor round
// starts as many stand-ins as the node's round has agents, with the same
// --events and --rate, sends each a turn, reads each one's stdout in a
// goroutine of its own and publishes every delta straight to JetStream,
// in a process of its own as the node is (FloorArg): one asynchronous
// publish per line on one connection, under the node's three headers (a
// message id among them), as an envelope of the node's own shape carrying
// the line's text. It does nothing else: no decoding beyond finding the
// text, no numbering kept anywhere, no journal. Every bare round has one,
// and in a paced run every watched round too.
//
// Its events/s (first turn sent to last publish acknowledged) is the
// anchor that pays for the same stand-ins the node reads: the four
// anchors publish envelopes already made, with no CLI printing them. Its
// latency from each line's print to stored, and to the live Kaimon bus in
// the watched rounds, is what the node's latency is read against:
// whatever of the node's tail the floor has too is the machine's (waking
// a reader for a pipe, scheduling the server), not the node's.
type floor struct {
	url    string
	exe    string
	events int
	rate   float64
	pub    *rawBaseline
	before []byte // a captured delta envelope up to its text
	after  []byte // and from the end of its text

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
// its envelopes shaped as the delta envelope among envelopes.
func newFloor(url, node, exe string, events int, rate float64, envelopes [][]byte) (*floor, error) {
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
		return nil, err
	}
	return &floor{url: url, exe: exe, events: events, rate: rate, pub: pub, before: before, after: after}, nil
}

// channel is the floor's channel on the Kaimon bus.
func (fl *floor) channel() string { return "agent:" + fl.pub.id }

func (fl *floor) close() { fl.pub.close() }

// FloorArg is the hidden subcommand that runs a floor round in a process
// of its own, as a node is one: its reader's wake-ups and the server's are
// then in two processes, as the node's are.
//
//	shoal __floor --nats URL --id ID --node NODE --first N --agents N --events N --rate R --before B64 --after B64
//
// Once every event is acknowledged it prints the number of the last one
// and the round's time in nanoseconds, from its first turn sent.
const FloorArg = "__floor"

// round runs n stand-ins' turns through a floor process and adds each
// delta's latency to stored once the stream holds them all.
func (fl *floor) round(ctx context.Context, n int) error {
	first := fl.pub.next
	cmd := exec.CommandContext(ctx, fl.exe, FloorArg, "--nats", fl.url, "--id", fl.pub.id, "--node", fl.pub.node,
		"--first", strconv.Itoa(first), "--agents", strconv.Itoa(n), "--events", strconv.Itoa(fl.events),
		"--rate", strconv.FormatFloat(fl.rate, 'f', -1, 64),
		"--before", base64.StdEncoding.EncodeToString(fl.before), "--after", base64.StdEncoding.EncodeToString(fl.after))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("the floor's process: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var last int
	var took time.Duration
	if _, err := fmt.Sscan(string(out), &last, &took); err != nil || last < first || took <= 0 {
		return fmt.Errorf("the floor's process answered %q", out)
	}
	fl.pub.next = last + 1
	fl.published += int64(last - first + 1)
	fl.took += took
	return fl.readBack(ctx, uint64(first), uint64(last))
}

// RunFloor runs a floor round (FloorArg's arguments) and returns the exit
// code.
func RunFloor(args []string) int {
	fs := flag.NewFlagSet(FloorArg, flag.ContinueOnError)
	url := fs.String("nats", "", "")
	id := fs.String("id", "", "")
	node := fs.String("node", "", "")
	first := fs.Int("first", 1, "")
	agents := fs.Int("agents", 1, "")
	events := fs.Int("events", 0, "")
	rate := fs.Float64("rate", 0, "")
	before := fs.String("before", "", "")
	after := fs.String("after", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	b, err1 := base64.StdEncoding.DecodeString(*before)
	a, err2 := base64.StdEncoding.DecodeString(*after)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", FloorArg, err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", FloorArg, err)
		return 1
	}
	pub, err := dialBaseline(*url, AnchorAsyncDedup, *node, "floor")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", FloorArg, err)
		return 1
	}
	defer pub.close()
	pub.id, pub.next = *id, *first
	fl := &floor{exe: exe, events: *events, rate: *rate, pub: pub, before: b, after: a}
	if err := fl.publishRound(*agents); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", FloorArg, err)
		return 1
	}
	fmt.Println(pub.next-1, int64(fl.took))
	return 0
}

// publishRound runs n stand-ins' turns, publishing each delta as it is
// read, and returns once every publish is acknowledged; fl.took is from
// the first turn sent to then.
func (fl *floor) publishRound(n int) error {
	type standin struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out io.ReadCloser
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
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("the floor's stand-in: %w", err)
		}
		ss[i] = standin{cmd, in, out}
	}
	var mu sync.Mutex // one publisher numbers and sends, as the node's one publisher does
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for _, s := range ss {
		if _, err := io.WriteString(s.in, `{"type":"user","message":{"role":"user","content":"floor"}}`+"\n"); err != nil {
			return fmt.Errorf("the floor's stand-in: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- fl.read(s.out, &mu)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	select {
	case <-fl.pub.js.PublishAsyncComplete():
		fl.took = time.Since(start)
		return nil
	case <-time.After(time.Minute):
		return errors.New("the floor's publishes not acknowledged in a minute")
	}
}

// read publishes every delta a stand-in prints until its result.
func (fl *floor) read(out io.Reader, mu *sync.Mutex) error {
	r := bufio.NewReaderSize(out, 16<<10)
	var env []byte
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("the floor's stand-in ended before its result: %w", err)
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
		env = append(append(append(env[:0], fl.before...), text[:j]...), fl.after...)
		mu.Lock()
		_, err = fl.pub.js.PublishMsgAsync(fl.pub.msg(bytes.Clone(env)), jetstream.WithStallWait(time.Minute))
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("the floor's publish: %w", err)
		}
	}
}

// readBack reads the floor's events first to last from the stream and
// adds each one's latency from its print to its storing.
func (fl *floor) readBack(ctx context.Context, first, last uint64) error {
	js, err := jetstream.New(fl.pub.conn)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return err
	}
	c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(fl.pub.id)}})
	if err != nil {
		return err
	}
	for seen := uint64(0); seen < last; {
		batch, err := c.Fetch(4096, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read the floor's events back: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			seen++
			if seen < first {
				continue
			}
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			if _, printed, ok := stamp(m.Data()); ok {
				fl.stored.add(md.Timestamp.UnixNano() - printed)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read the floor's events back: %w", err)
		}
		if got == 0 {
			return fmt.Errorf("read the floor's events back: %d of %d", seen, last)
		}
	}
	return nil
}
