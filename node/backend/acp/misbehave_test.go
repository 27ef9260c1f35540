package acp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/schemas"
)

// fakeAgentEnv makes the test binary an ACP agent that misbehaves in the
// way the variable names: garbage, crash or hang.
const fakeAgentEnv = "SHOAL_ACP_TEST_FAKE_AGENT"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeAgentEnv); mode != "" {
		os.Exit(fakeAgent(mode))
	}
	goleak.VerifyTestMain(m)
}

// fakeAgent answers the handshake like an ACP agent, then misbehaves on
// the first prompt.
func fakeAgent(mode string) int {
	if mode == "hang" {
		// Like gemini: SIGTERM does nothing; only the group's SIGKILL
		// ends it.
		signal.Ignore(syscall.SIGTERM)
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	sc := bufio.NewScanner(os.Stdin)
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
			say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"sessionId": "fake-session"}})
		case "session/prompt":
			chunk := func(text string) {
				say(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
					"sessionId": "fake-session", "update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}}}})
			}
			switch mode {
			case "garbage":
				out.WriteString("this is not JSON-RPC at all\n")
				out.Flush()
				chunk("still here")
				say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"stopReason": "end_turn"}})
			case "crash":
				chunk("about to fall")
				fmt.Fprintln(os.Stderr, "fatal: the fake agent fell over")
				return 3
			case "hang":
				chunk("thinking forever")
				select {}
			case "racer":
				chunk(race(sc, say))
				say(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"stopReason": "end_turn"}})
			}
		}
	}
	return 0
}

// startFake runs the test binary as a misbehaving opencode.
func startFake(t *testing.T, mode string, env ...string) (backend.Session, *recorder) {
	t.Helper()
	rec := newRecorder(t)
	return startAs(t, acp.AgentClaude, rec, append([]string{fakeAgentEnv + "=" + mode}, env...)...), rec
}

// startAs starts an agent of kind agent that is the test binary, its
// mode chosen by env, its events going to sink.
func startAs(t *testing.T, agent string, sink backend.Sink, env ...string) backend.Session {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := schemas.ComposePolicy("bypass", "", nil, nil, false)
	b := acp.New(acp.Config{Commands: map[string][]string{agent: {exe}},
		Env: append([]string{"GORACE=atexit_sleep_ms=0", "PATH=" + os.Getenv("PATH")}, env...), StopWait: 500 * time.Millisecond})
	t.Cleanup(func() { b.Close() })
	sess, err := b.Start(t.Context(), backend.Spec{AgentID: "f1", CWD: t.TempDir(), Model: agent, Policy: pol, Dir: t.TempDir()}, sink)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { sess.Close(t.Context()) })
	return sess
}

// An agent that prints a line that is not JSON-RPC gets an error event
// for it, and the turn goes on.
func TestACPAgentPrintsGarbage(t *testing.T) {
	t.Parallel()
	sess, rec := startFake(t, "garbage")
	n, err := rec.send(sess, "go")
	if err != nil {
		t.Fatal(err)
	}
	evs := rec.result(0, n)
	if !anyContains(errorsIn(evs), "printed a line that is not JSON-RPC") || finalText(evs) != "still here" {
		t.Fatalf("events: %s", summary(evs))
	}
	if res := evs[len(evs)-1].Payload.(schemas.Result); res.StopReason != schemas.StopEndTurn {
		t.Fatalf("the turn ended %s", res.StopReason)
	}
}

// An agent that dies mid-turn: an error with its exit and last words,
// what it streamed as the authoritative text, then status dead; the turn
// is the node's to end, since the agent did not.
func TestACPAgentCrashes(t *testing.T) {
	t.Parallel()
	sess, rec := startFake(t, "crash")
	if _, err := rec.send(sess, "go"); err != nil {
		t.Fatal(err)
	}
	evs := rec.waitFor(0, "status dead", func(ev schemas.Event) bool {
		st, ok := ev.Payload.(schemas.Status)
		return ok && st.Status == schemas.StatusDead
	})
	if !anyContains(errorsIn(evs), "acp:claude exited: exit status 3: fatal: the fake agent fell over") {
		t.Fatalf("events: %s", summary(evs))
	}
	if has[schemas.Result](evs) || finalText(evs) != "about to fall" {
		t.Fatalf("the turn: %s", summary(evs))
	}
	if _, err := rec.send(sess, "again"); err == nil {
		t.Fatal("a dead agent took a turn")
	}
}

// An agent that hangs and ignores SIGTERM: the interrupt is sent, and
// close still ends it, its whole process group, with status dead.
func TestACPAgentHangs(t *testing.T) {
	t.Parallel()
	sess, rec := startFake(t, "hang")
	from := rec.len()
	n, err := rec.send(sess, "go")
	if err != nil {
		t.Fatal(err)
	}
	rec.waitFor(from, "the first chunk", func(ev schemas.Event) bool { return ev.IsDelta() && ev.Turn == n })
	if ok, err := sess.Interrupt(t.Context()); !ok || err != nil {
		t.Fatalf("interrupt: %v %v", ok, err)
	}
	r := &agentRig{t: t, sess: sess, rec: rec}
	r.closeAndCheck()
	if evs := rec.since(from); !strings.HasSuffix(summary(evs), "status ") {
		t.Fatalf("the hung agent did not die: %s", summary(evs))
	}
}
