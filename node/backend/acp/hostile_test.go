package acp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/schemas"
)

// hostileAgentEnv makes the test binary a hostile ACP agent, chosen
// before TestMain runs.
const hostileAgentEnv = "SHOAL_ACP_HOSTILE_AGENT"

func init() {
	if mode := os.Getenv(hostileAgentEnv); mode != "" {
		os.Exit(hostileAgent(mode))
	}
}

// hostileAgent answers the handshake, then on the first prompt:
//
//	endturn   streams a chunk, waits for session/cancel, streams more
//	          and answers the prompt end_turn (goose #11788)
//	readflood writes an 8 MiB file in its directory, asks its client to
//	          read it $SHOAL_ACP_HOSTILE_N times at once, and reads
//	          nothing more from its stdin
//	readmany  asks its client to read 16 small files at once, reads the
//	          answers and says how many it got
//	usage     answers the prompt with a usage of 1e19 input tokens
func hostileAgent(mode string) int {
	out := bufio.NewWriter(os.Stdout)
	say := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	chunk := func(text string) {
		say(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
			"sessionId": "hostile-session", "update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}}}})
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(sc.Bytes(), &req) != nil {
			continue
		}
		switch req.Method {
		case "initialize":
			say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{}}})
		case "session/new":
			say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"sessionId": "hostile-session"}})
		case "session/prompt":
			switch mode {
			case "endturn":
				chunk("working ")
				for sc.Scan() {
					if strings.Contains(sc.Text(), `"session/cancel"`) {
						break
					}
				}
				chunk("and still working after the cancel")
				say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"stopReason": "end_turn"}})
			case "readflood":
				os.WriteFile("big", []byte(strings.Repeat("0123456789abcde\n", (8<<20)/16)), 0o600)
				var n int
				fmt.Sscan(os.Getenv("SHOAL_ACP_HOSTILE_N"), &n)
				wd, _ := os.Getwd()
				for i := range n {
					say(map[string]any{"jsonrpc": "2.0", "id": 5000 + i, "method": "fs/read_text_file",
						"params": map[string]any{"sessionId": "hostile-session", "path": wd + "/big"}})
				}
				time.Sleep(time.Minute) // and reads nothing
				return 0
			case "readmany":
				wd, _ := os.Getwd()
				for i := range 16 {
					os.WriteFile(fmt.Sprintf("f%d", i), []byte(fmt.Sprintf("file %d", i)), 0o600)
				}
				for i := range 16 {
					say(map[string]any{"jsonrpc": "2.0", "id": 6000 + i, "method": "fs/read_text_file",
						"params": map[string]any{"sessionId": "hostile-session", "path": fmt.Sprintf("%s/f%d", wd, i)}})
				}
				read := 0
				for read < 16 && sc.Scan() {
					var ans struct {
						ID     int `json:"id"`
						Result struct {
							Content string `json:"content"`
						} `json:"result"`
					}
					if json.Unmarshal(sc.Bytes(), &ans) == nil && ans.ID >= 6000 && ans.Result.Content == fmt.Sprintf("file %d", ans.ID-6000) {
						read++
					} else if ans.ID >= 6000 {
						break
					}
				}
				chunk(fmt.Sprintf("read %d of 16", read))
				say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"stopReason": "end_turn"}})
			case "usage":
				say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"stopReason": "end_turn",
					"usage": map[string]any{"inputTokens": 1e19, "outputTokens": 2e12}}})
			}
		}
	}
	return 0
}

func startHostile(t *testing.T, mode string, env ...string) (backend.Session, *recorder) {
	t.Helper()
	rec := newRecorder(t)
	return startAs(t, acp.AgentGemini, rec, append([]string{hostileAgentEnv + "=" + mode}, env...)...), rec
}

// An interrupted turn ends cancelled (README, ACP agents), whatever the
// agent answers: one that answers the cancel with more output and
// end_turn (as goose did) had its turn reported end_turn.
func TestACPCancelledTurnAnsweredEndTurnIsReportedCancelled(t *testing.T) {
	t.Parallel()
	sess, rec := startHostile(t, "endturn")
	n, err := rec.send(sess, "go")
	if err != nil {
		t.Fatal(err)
	}
	rec.waitFor(0, "the first chunk", func(ev schemas.Event) bool { return ev.IsDelta() })
	if ok, err := sess.Interrupt(t.Context()); !ok || err != nil {
		t.Fatalf("interrupt: %v %v", ok, err)
	}
	evs := rec.result(0, n)
	if res := evs[len(evs)-1].Payload.(schemas.Result); res.StopReason != schemas.StopCancelled {
		t.Fatalf("the interrupted turn ended %q, want cancelled: %s", res.StopReason, summary(evs))
	}
}

// An agent that asks its client to read an 8 MiB file in its own
// directory many times at once, and then reads none of the answers: each
// request read the whole file and held it, and its answer, while the
// answer waited to be written (10 s each), so 40 request lines of 116
// bytes took 740 MiB of the node's heap, and a few thousand any node's
// memory, with every agent on it. One is under way at a time, until a
// write to the agent goes through; the others wait or are refused.
func TestACPFileReadFloodIsBounded(t *testing.T) {
	const n = 40
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	sess, rec := startHostile(t, "readflood", fmt.Sprintf("SHOAL_ACP_HOSTILE_N=%d", n))
	if _, err := rec.send(sess, "go"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	close(stop)
	<-done
	grew := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("heap in use: %d MiB before, %d MiB at the peak", base.HeapInuse>>20, peak.Load()>>20)
	if grew > 128<<20 {
		t.Errorf("%d read requests of ~%d bytes each made the node hold %d MiB more heap (%.1f MiB a request): the agent's requests are served with no bound",
			n, len(`{"jsonrpc":"2.0","id":5000,"method":"fs/read_text_file","params":{"path":"/tmp/x/big","sessionId":"hostile-session"}}`), grew>>20, float64(grew)/float64(n)/(1<<20))
	}
}

// An agent reading many files at once gets every one: those past the
// requests under way wait their turn.
func TestACPManyFileReadsAtOnceAreServed(t *testing.T) {
	t.Parallel()
	sess, rec := startHostile(t, "readmany")
	n, err := rec.send(sess, "go")
	if err != nil {
		t.Fatal(err)
	}
	evs := rec.result(0, n)
	if text := summary(evs); !strings.Contains(text, "read 16 of 16") {
		t.Fatalf("16 reads at once: %s", text)
	}
}

// plainSink keeps events without checking them.
type plainSink struct {
	mu  sync.Mutex
	evs []schemas.Event
}

func (p *plainSink) Emit(ev schemas.Event) {
	p.mu.Lock()
	p.evs = append(p.evs, ev)
	p.mu.Unlock()
}

// An ACP agent's usage of 1e19 input tokens was converted from a float to
// an int64, which on amd64 gives math.MinInt64: a negative count, taken
// off every sum it joined. The count is held at the top instead (the
// node holds a result's figures to one turn's range, and says so).
func TestACPHugeUsageIsNoNegativeCount(t *testing.T) {
	t.Parallel()
	sink := &plainSink{}
	sess := startAs(t, acp.AgentGemini, sink, hostileAgentEnv+"=usage")
	if err := sess.Prompt(t.Context(), 1, "go"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		sink.mu.Lock()
		evs := slices.Clone(sink.evs)
		sink.mu.Unlock()
		for _, ev := range evs {
			if r, ok := ev.Payload.(schemas.Result); ok {
				if u := r.Usage; u == nil || u.InputTokens < schemas.MaxTurnTokens || u.OutputTokens != 2e12 {
					t.Fatalf("the result's usage %+v, want input tokens past a turn's range (not wrapped) and 2e12 output tokens", u)
				}
				return
			}
		}
	}
	t.Fatal("no result")
}
