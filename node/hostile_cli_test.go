package node_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// hostileFakeEnv makes the test binary a hostile claude CLI (or its
// grandchild), chosen before TestMain runs.
const hostileFakeEnv = "SHOAL_HOSTILE_CLI"

func init() {
	mode := os.Getenv(hostileFakeEnv)
	if mode == "" {
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println("0.0.0 (hostile fake claude)")
		os.Exit(0)
	}
	if len(os.Args) > 2 && os.Args[1] == "auth" && os.Args[2] == "status" {
		fmt.Println(`{"loggedIn": true, "authMethod": "api_key"}`)
		os.Exit(0)
	}
	os.Exit(hostileFake(mode))
}

// hostileFake:
//
//	hold     sleeps (at most two minutes): the escaped grandchild, which
//	         holds the stdout it inherited
//	escape   on the first turn starts a grandchild in a session of its
//	         own with a cleared environment (no SHOAL_PROC, no
//	         SHOAL_AGENT_LIFE) that inherits stdout, then dies mid-turn
//	double   ends its first turn twice (two result lines), every other
//	         turn once
//	usage    answers each turn, its result reporting a usage out of the
//	         schema's range ($SHOAL_HOSTILE_USAGE input tokens)
//	asks     asks permission for 40 tool calls at once, and writes to
//	         $SHOAL_HOSTILE_OUT how many were denied, as each answer comes
func hostileFake(mode string) int {
	if mode == "hold" {
		time.Sleep(2 * time.Minute)
		return 0
	}
	out := bufio.NewWriter(os.Stdout)
	emit := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	delta := func(text string) {
		emit(map[string]any{"type": "stream_event", "event": map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": text}}})
	}
	turn := 0
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var m struct {
			Type string `json:"type"`
		}
		json.Unmarshal(in.Bytes(), &m)
		if m.Type != "user" {
			continue
		}
		emit(map[string]any{"type": "system", "subtype": "init", "session_id": "hostile-session"})
		switch mode {
		case "asks":
			for i := range 40 {
				emit(map[string]any{"type": "control_request", "request_id": fmt.Sprintf("ask-%d", i), "request": map[string]any{
					"subtype": "can_use_tool", "tool_name": "Bash", "tool_use_id": fmt.Sprintf("toolu_%d", i),
					"input": map[string]any{"command": fmt.Sprintf("echo %d", i)}}})
			}
			denied := 0
			for in.Scan() {
				if strings.Contains(in.Text(), `"behavior":"deny"`) {
					denied++
					os.WriteFile(os.Getenv("SHOAL_HOSTILE_OUT"), []byte(strconv.Itoa(denied)), 0o600)
				}
			}
			return 0
		case "escape":
			delta("about to ")
			child := exec.Command(os.Args[0])
			child.Env = []string{hostileFakeEnv + "=hold"}
			child.Stdout = os.Stdout
			child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := child.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			os.WriteFile(os.Getenv("SHOAL_HOSTILE_PIDFILE"), []byte(strconv.Itoa(child.Process.Pid)), 0o600)
			fmt.Fprintln(os.Stderr, "fatal: the fake CLI fell over, leaving a child")
			return 3
		case "double":
			// Turn 1 ends twice; every later turn once, after its output.
			turn++
			if turn == 1 {
				time.Sleep(time.Second)
			}
			reply := fmt.Sprintf("reply to turn %d", turn)
			delta(reply)
			emit(map[string]any{"type": "assistant", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": reply}}}})
			result := map[string]any{"type": "result", "subtype": "success", "is_error": false, "stop_reason": "end_turn", "session_id": "hostile-session",
				"usage": map[string]any{"input_tokens": 1, "output_tokens": 1}}
			emit(result)
			if turn == 1 {
				emit(result)
			}
		case "usage":
			n, _ := strconv.ParseInt(os.Getenv("SHOAL_HOSTILE_USAGE"), 10, 64)
			emit(map[string]any{"type": "assistant", "message": map[string]any{"id": "msg-1", "usage": map[string]any{"input_tokens": n, "output_tokens": 3},
				"content": []any{map[string]any{"type": "text", "text": "done"}}}})
			emit(map[string]any{"type": "result", "subtype": "success", "is_error": false, "stop_reason": "end_turn", "session_id": "hostile-session",
				"usage": map[string]any{"input_tokens": n, "output_tokens": 3}})
		}
	}
	return 0
}

func hostileCLI(mode string, env ...string) claude.Config {
	return claude.Config{
		Path:     os.Args[0],
		Env:      append(append(os.Environ(), hostileFakeEnv+"="+mode), env...),
		StopWait: 500 * time.Millisecond,
	}
}

// waitFor waits up to d for an event matching pred; it reports whether
// one came.
func (w *watcher) waitFor(d time.Duration, pred func(schemas.Event) bool) bool {
	deadline := time.After(d)
	for {
		w.mu.Lock()
		for _, e := range w.evs {
			if pred(e.Event) {
				w.mu.Unlock()
				return true
			}
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-deadline:
			return false
		}
	}
}

// A CLI that dies mid-turn after starting a child that leaves its process
// group and clears its environment (so neither the group kill nor the
// token reaches it), the child holding the stdout it inherited: the agent
// is dead once the CLI is, its turn ended. The node read the CLI's stdout
// to its end before it took the exit, so the turn never ended, status
// dead never came and closing it never finished, for as long as the child
// lived (a daemon: as long as the node).
func TestEscapedChildHoldingStdoutKeepsNoDeadAgentAlive(t *testing.T) {
	t.Parallel()
	pidfile := filepath.Join(t.TempDir(), "child.pid")
	f := startNode(t, fixtureOptions{claude: hostileCLI("escape", "SHOAL_HOSTILE_PIDFILE="+pidfile)})
	t.Cleanup(func() {
		// Let the node stop: the escaped child goes first.
		if b, err := os.ReadFile(pidfile); err == nil {
			if pid, _ := strconv.Atoi(string(b)); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	w.until(0, "status idle", isStatus(schemas.StatusIdle))
	cli := pidOf(t, f, id)
	f.send(id, "go")
	if !w.waitFor(10*time.Second, func(ev schemas.Event) bool { return ev.IsDelta() }) {
		t.Fatalf("the turn did not start: %s", strings.Join(w.summary(0), " "))
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(cli) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(cli) {
		t.Fatalf("the fake CLI %d did not exit", cli)
	}
	if !w.waitFor(15*time.Second, isStatus(schemas.StatusDead)) {
		t.Fatalf("the CLI (pid %d) exited 3 mid-turn; 15 s later turn 1 has not ended and no status dead came: %s",
			cli, strings.Join(w.summary(0), " "))
	}
}

// A CLI that ends a turn twice (two result lines) ends no other turn: the
// node took the second for the end of the turn it held next, which it
// had just written, so that turn was reported ended, end_turn with no
// text, before the CLI answered it, its answer streamed after its result
// and its real result was dropped. A result is a turn's only once the CLI
// has begun it (its system/init line).
func TestDoubleResultEndsNoHeldTurn(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: hostileCLI("double")})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	w.until(0, "status idle", isStatus(schemas.StatusIdle))
	if n := f.send(id, "first"); n != 1 {
		t.Fatalf("turn %d", n)
	}
	if n := f.send(id, "second"); n != 2 { // held while turn 1 runs
		t.Fatalf("turn %d", n)
	}
	i := w.until(0, "the result of turn 2", isResult(2))
	var text []string
	for _, e := range w.events()[:i] {
		if p, ok := e.Payload.(schemas.AssistantText); ok && !p.Delta && e.Turn == 2 {
			text = append(text, p.Content.Text)
		}
	}
	if len(text) != 1 || text[0] != "reply to turn 2" {
		t.Fatalf("turn 2 ended with the text %q, want its own answer: %s", text, strings.Join(w.summary(0), " "))
	}
}

// A CLI (or a model server, an ACP agent) that reports a usage out of the
// schema's range: the node published its result as it was, an envelope
// every reader's schemas.Decode refuses, so the coordinator's ledger did
// not count the turn and readers skipped it as a stranger's. The figures
// are held to the range, and an error says what was reported.
func TestOutOfRangeUsageIsHeldToTheSchema(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"-5", "2000000000000"} {
		t.Run(n, func(t *testing.T) {
			t.Parallel()
			f := startNode(t, fixtureOptions{claude: hostileCLI("usage", "SHOAL_HOSTILE_USAGE="+n)})
			id := f.open(schemas.OpenRequest{})
			// Read the raw stream: the watcher would only fail on it.
			sub, err := f.fabric.Conn().SubscribeSync(schemas.EventSubject(id))
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			f.send(id, "go")
			said := false
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				msg, err := sub.NextMsg(time.Until(deadline))
				if err != nil {
					break
				}
				kind, _, _, _ := schemas.Peek(msg.Data)
				if kind == schemas.KindError && strings.Contains(string(msg.Data), "usage out of range (input "+n+",") {
					said = true
				}
				if kind != schemas.KindResult {
					continue
				}
				ev, err := schemas.Decode(msg.Data)
				if err != nil {
					t.Fatalf("the node published a result no reader can decode: %s: %v", msg.Data, err)
				}
				u := ev.Payload.(schemas.Result).Usage
				if want := map[string]int64{"-5": 0, "2000000000000": schemas.MaxTurnTokens}[n]; u == nil || u.InputTokens != want {
					t.Errorf("the result's usage %+v, want %d input tokens", u, want)
				}
				if !said {
					t.Errorf("no error before the result says the usage was out of range")
				}
				return
			}
			t.Fatal("no result")
		})
	}
}

// A CLI asking permission for many tool calls at once (under ask, each
// waits for a person, for ten minutes): the node held each request, its
// input and a goroutine, and wrote the whole list of them to its file at
// each one. At most 16 of an agent's wait, as the relay holds a node with
// credentials to; the others are denied at once, saying why.
func TestNodeHoldsAnAgentsPermissionRequestsToSixteen(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "denied")
	f := startNode(t, fixtureOptions{claude: hostileCLI("asks", "SHOAL_HOSTILE_OUT="+out)})
	id := f.open(schemas.OpenRequest{Permission: "ask"})
	w := f.watch(id)
	f.send(id, "go")
	poll.Until(t, time.Minute, "24 of the 40 requests denied at once", func() bool {
		b, _ := os.ReadFile(out)
		return string(b) == "24"
	})
	all, err := f.fabric.Pending(f.ctx(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	waiting := 0
	for _, r := range all.Requests {
		if r.AgentID == id {
			waiting++
		}
	}
	if waiting != 16 {
		t.Errorf("%d of the agent's requests wait for a person, want 16", waiting)
	}
	if !w.waitFor(10*time.Second, func(ev schemas.Event) bool {
		e, ok := ev.Payload.(schemas.Error)
		return ok && strings.Contains(e.Message, "16 permission requests of agent "+id+" wait for a person already")
	}) {
		t.Errorf("no error says why the others were denied: %s", strings.Join(w.summary(0), " "))
	}
}

// An agent closed while its permission requests wait: the node forgets
// them as it retires the agent, and each request's wait, ended with the
// agent, settled a request it no longer held. An outside review's node
// died of it (a nil answer) after some opens and closes, and every agent
// on it with it. Now each wait ends denied and the node goes on.
func TestClosingAnAgentWhoseRequestsWaitLeavesItsNodeRunning(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: hostileCLI("asks", "SHOAL_HOSTILE_OUT="+filepath.Join(t.TempDir(), "denied"))})
	for round := range 4 {
		id := f.open(schemas.OpenRequest{Permission: "ask"})
		f.send(id, "go")
		poll.Until(t, time.Minute, "the agent's requests to wait", func() bool {
			all, err := f.fabric.Pending(f.ctx(10 * time.Second))
			n := 0
			for _, r := range all.Requests {
				if r.AgentID == id {
					n++
				}
			}
			return err == nil && n == 16
		})
		if _, err := f.fabric.Close(f.ctx(time.Minute), schemas.AgentRequest{AgentID: id}); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
	}
	// The node still answers.
	id := f.open(schemas.OpenRequest{})
	if _, err := f.fabric.Status(f.ctx(10*time.Second), id); err != nil {
		t.Errorf("the node after the closes: %v", err)
	}
}
