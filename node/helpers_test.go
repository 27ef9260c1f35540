package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case proc.ReaperArg: // the node's reaper, as shoal __reaper is
			os.Exit(proc.RunReaper())
		case proc.KeeperArg:
			os.Exit(proc.RunKeeper(os.Args[2:]))
		case proc.SandboxArg:
			os.Exit(proc.RunSandbox(os.Args[2:]))
		case proc.SandboxInitArg:
			os.Exit(proc.RunSandboxInit(os.Args[2:]))
		}
	}
	if mode := os.Getenv("SHOAL_FAKE_CLAUDE"); mode != "" {
		fakeClaude(mode)
		return
	}
	if os.Getenv("SHOAL_TEST_NODE") == "1" {
		os.Exit(nodeProcess())
	}
	if dir := os.Getenv("SHOAL_TEST_BROKER"); dir != "" {
		os.Exit(brokerProcess(dir))
	}
	goleak.VerifyTestMain(m, natstest.KnownLeaks...)
}

// fixture is a broker, a node and a fabric client for one test.
type fixture struct {
	t      *testing.T
	b      *broker.Broker
	host   *node.Host
	fabric *client.Direct
	js     jetstream.JetStream
	dir    string
	stop   context.CancelFunc
	done   chan error
	once   sync.Once // shutdown's
}

type fixtureOptions struct {
	claude claude.Config
	node   func(*node.Config)
	dir    string
	broker *broker.Broker
	url    string // a broker in another process, instead of broker
}

// fakeCLI is a claude backend config that runs this test binary as a fake
// claude CLI in the given mode.
func fakeCLI(mode string, env ...string) claude.Config {
	return claude.Config{
		Path:     os.Args[0],
		Env:      append(append(os.Environ(), "SHOAL_FAKE_CLAUDE="+mode), env...),
		StopWait: 500 * time.Millisecond,
	}
}

func startNode(t *testing.T, o fixtureOptions) *fixture {
	t.Helper()
	b := o.broker
	if b == nil && o.url == "" {
		b = natstest.Start(t)
	}
	dir := o.dir
	if dir == "" {
		dir = t.TempDir()
	}
	connect := func() *nats.Conn {
		if o.url != "" {
			return connectTo(t, o.url)
		}
		return natstest.Connect(t, b)
	}
	nc := connect()
	cfg := node.Config{
		Name:     "n1",
		Conn:     nc,
		Dir:      dir,
		Backends: []backend.Backend{claude.New(o.claude)},
		Reaper:   os.Args[0],
	}
	if o.node != nil {
		o.node(&cfg)
	}
	h, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{t: t, b: b, host: h, dir: dir, stop: cancel, done: make(chan error, 1)}
	go func() { f.done <- h.Run(ctx) }()
	select {
	case <-h.Ready():
	case err := <-f.done:
		t.Fatalf("node did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("node not ready")
	}
	t.Cleanup(f.shutdown)
	if f.fabric, err = client.NewDirect(connect(), client.Config{}); err != nil {
		t.Fatal(err)
	}
	f.js = f.fabric.JetStream()
	return f
}

// shutdown stops the node and waits for it.
func (f *fixture) shutdown() {
	f.once.Do(func() {
		f.stop()
		select {
		case <-f.done:
		case <-time.After(60 * time.Second):
			f.t.Error("node did not stop")
		}
	})
}

func (f *fixture) ctx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(f.t.Context(), d)
	f.t.Cleanup(cancel)
	return ctx
}

func (f *fixture) open(req schemas.OpenRequest) string {
	f.t.Helper()
	if req.CWD == "" {
		req.CWD = f.t.TempDir()
	}
	if req.Node == "" {
		req.Node = "n1"
	}
	// As long as a client waits: a CLI of node.js (opencode) starting on
	// a machine busy with the race detector took longer than 30 s.
	rep, err := f.fabric.Open(f.ctx(schemas.OpenTimeout), req)
	if err != nil {
		f.t.Fatalf("open: %v", err)
	}
	return rep.AgentID
}

func (f *fixture) send(id, text string) int {
	f.t.Helper()
	rep, err := f.fabric.Send(f.ctx(30*time.Second), schemas.SendRequest{AgentID: id, Text: text})
	if err != nil {
		f.t.Fatalf("send: %v", err)
	}
	return rep.Turn
}

// stored is one event as the stream holds it.
type stored struct {
	schemas.Event
	seq  uint64
	node string
	raw  []byte
}

// watcher follows an agent's events on the stream, checking every one
// against the schema files and the gapless numbering.
type watcher struct {
	t    *testing.T
	id   string
	mu   sync.Mutex
	evs  []stored
	wake chan struct{}
	// allowGaps lets the numbering jump, for a test that makes it.
	allowGaps bool
}

func (f *fixture) watch(id string) *watcher {
	f.t.Helper()
	return f.watchWith(id, false)
}

// watchWith is watch, letting the numbering jump when allowGaps.
func (f *fixture) watchWith(id string, allowGaps bool) *watcher {
	f.t.Helper()
	w := &watcher{t: f.t, id: id, wake: make(chan struct{}, 1), allowGaps: allowGaps}
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	cons, err := f.js.OrderedConsumer(ctx, schemas.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		f.t.Fatal(err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		f.t.Fatal(err)
	}
	context.AfterFunc(ctx, msgs.Stop)
	go func() {
		for {
			msg, err := msgs.Next()
			if err != nil {
				return
			}
			data := append([]byte(nil), msg.Data()...)
			ev, derr := schemas.Decode(data)
			verr := schematest.ValidateEvent(data)
			_, n, merr := schemas.ParseMsgID(msg.Headers().Get(schemas.HeaderMsgID))
			w.mu.Lock()
			switch {
			case derr != nil || verr != nil:
				w.t.Errorf("invalid event on %s: %s: %v %v", msg.Subject(), data, derr, verr)
			case merr != nil:
				w.t.Errorf("event without a valid message id: %v", merr)
			case len(w.evs) > 0 && n != w.evs[len(w.evs)-1].seq+1 && !(w.allowGaps && n > w.evs[len(w.evs)-1].seq):
				w.t.Errorf("event number %d follows %d: not gapless", n, w.evs[len(w.evs)-1].seq)
			}
			w.evs = append(w.evs, stored{Event: ev, seq: n, node: msg.Headers().Get(schemas.HeaderNode), raw: data})
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// until waits for an event matching pred (after index from) and returns
// its index.
func (w *watcher) until(from int, what string, pred func(schemas.Event) bool) int {
	w.t.Helper()
	deadline := time.After(90 * time.Second)
	for {
		w.mu.Lock()
		for i := from; i < len(w.evs); i++ {
			if pred(w.evs[i].Event) {
				w.mu.Unlock()
				return i
			}
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-deadline:
			w.t.Fatalf("agent %s: no %s; saw %s", w.id, what, strings.Join(w.summary(0), " "))
		}
	}
}

func isKind(k schemas.Kind) func(schemas.Event) bool {
	return func(ev schemas.Event) bool { return ev.Kind() == k }
}

func isStatus(s schemas.AgentStatus) func(schemas.Event) bool {
	return func(ev schemas.Event) bool {
		st, ok := ev.Payload.(schemas.Status)
		return ok && st.Status == s
	}
}

func isResult(turn int) func(schemas.Event) bool {
	return func(ev schemas.Event) bool { return ev.Kind() == schemas.KindResult && ev.Turn == turn }
}

func (w *watcher) events() []stored {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]stored(nil), w.evs...)
}

// summary lists the events from index from as kind@turn, with runs of
// deltas collapsed into one "+" entry and status events named.
func (w *watcher) summary(from int) []string {
	var out []string
	for _, e := range w.events()[from:] {
		s := string(e.Kind())
		if st, ok := e.Payload.(schemas.Status); ok {
			s = "status:" + string(st.Status)
		}
		if e.IsDelta() {
			s += "+"
		}
		s = fmt.Sprintf("%s@%d", s, e.Turn)
		if len(out) > 0 && out[len(out)-1] == s && e.IsDelta() {
			continue
		}
		out = append(out, s)
	}
	return out
}

func errorsOf(evs []stored) []string {
	var out []string
	for _, e := range evs {
		if p, ok := e.Payload.(schemas.Error); ok {
			out = append(out, p.Message)
		}
	}
	return out
}

// nodeProcess runs a node in this process until it is killed: the node of
// tests that kill one for real. $SHOAL_TEST_NATS, $SHOAL_TEST_DIR and
// $SHOAL_TEST_MODE configure it; with $SHOAL_TEST_ACP_SCRIPT its one
// backend is ACP, its gemini agent that script.
func nodeProcess() int {
	nc, err := nats.Connect(os.Getenv("SHOAL_TEST_NATS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var be backend.Backend = claude.New(fakeCLI(os.Getenv("SHOAL_TEST_MODE")))
	if script := os.Getenv("SHOAL_TEST_ACP_SCRIPT"); script != "" {
		be = acp.New(acp.Config{Commands: map[string][]string{acp.AgentGemini: {script}}})
	}
	h, err := node.New(node.Config{
		Name: "n1", Conn: nc, Dir: os.Getenv("SHOAL_TEST_DIR"),
		Backends: []backend.Backend{be},
		Reaper:   os.Args[0],
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// SIGTERM stops it cleanly, as `shoal node` does; SIGKILL is a crash.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := h.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// brokerProcess runs a test broker, its store in dir, until its stdin
// ends: for measurements of the node alone, with the server in another
// process. It prints the broker's client URL on its first line.
func brokerProcess(dir string) int {
	port := -1
	if p, err := strconv.Atoi(os.Getenv("SHOAL_TEST_BROKER_PORT")); err == nil {
		port = p
	}
	b, err := broker.New(broker.Config{Port: port, StoreDir: dir, Assets: broker.Assets{MaxBytes: 256 << 20, NodeTTL: 2 * time.Second}})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = b.Start(ctx)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(b.ClientURL())
	io.Copy(io.Discard, os.Stdin)
	b.Shutdown()
	return 0
}

// startBrokerProcess runs brokerProcess in a child and returns its URL;
// the child stops when tb ends.
func startBrokerProcess(tb testing.TB) string {
	return runBrokerProcess(tb, tb.TempDir(), 0).url
}

// brokerProc is a broker in a child process, which a test may kill.
type brokerProc struct {
	cmd *exec.Cmd
	url string
}

// runBrokerProcess starts brokerProcess on store, on port (any when 0).
func runBrokerProcess(tb testing.TB, store string, port int) *brokerProc {
	tb.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SHOAL_TEST_BROKER="+store)
	if port > 0 {
		cmd.Env = append(cmd.Env, "SHOAL_TEST_BROKER_PORT="+strconv.Itoa(port))
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	url, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("the broker process did not start: %v", err)
	}
	return &brokerProc{cmd: cmd, url: strings.TrimSpace(url)}
}

// kill kills the broker with SIGKILL.
func (b *brokerProc) kill() {
	b.cmd.Process.Signal(syscall.SIGKILL)
	b.cmd.Wait()
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// gone reports whether no process of group pgid is left.
func gone(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == syscall.ESRCH
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func newFabric(t *testing.T, b *broker.Broker) (*client.Direct, error) {
	return client.NewDirect(natstest.Connect(t, b), client.Config{})
}

// ask sends a control request straight to node n1, past the fabric's own
// checks, and decodes its reply into rep; the error is the node's.
func (f *fixture) ask(verb schemas.Verb, req, rep any) error {
	f.t.Helper()
	msg, err := natstest.Connect(f.t, f.b).Request(schemas.ControlSubject("n1", verb), []byte(mustJSON(req)), 30*time.Second)
	if err != nil {
		f.t.Fatalf("%s request: %v", verb, err)
	}
	return schemas.DecodeReply(msg.Data, rep)
}

// nodeList is node n1's own agent_list: the agents it keeps in memory.
func nodeList(t *testing.T, f *fixture) []schemas.AgentRecord {
	t.Helper()
	var rep schemas.ListReply
	if err := f.ask(schemas.VerbList, schemas.ListRequest{}, &rep); err != nil {
		t.Fatalf("list: %v", err)
	}
	return rep.Agents
}

func jsonOf(v any, into any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}
