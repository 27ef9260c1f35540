package node_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// The real claude CLI folds a line written during a tool call into the
// running turn; the node holds it instead, so a turn sent while a Bash
// tool runs becomes its own turn, with its own turn_started and result,
// and a run sent right after answers with its own text. Ten sends in a
// burst are ten turns, in order.
func TestRealClaudeTurnDuringToolCall(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"sleep 3; echo first","description":"Wait, then print"}`)}}},
		fakemodel.Reply{Text: "The command printed first."},
		fakemodel.Reply{Text: "The second answer."},
	)
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}})
	id := f.open(schemas.OpenRequest{Permission: "bypass"})
	w := f.watch(id)
	f.send(id, "Run the slow command.")
	w.until(0, "the Bash call", func(ev schemas.Event) bool {
		u, ok := ev.Payload.(schemas.ToolUse)
		return ok && u.Call.RawInput != nil
	})
	rep, err := f.fabric.Run(f.ctx(90*time.Second), schemas.RunRequest{AgentID: id, Text: "second message"})
	if err != nil || rep.Text != "The second answer." || rep.Turn != 2 || rep.StopReason != schemas.StopEndTurn {
		t.Fatalf("the run sent during the tool call: %+v %v", rep, err)
	}
	w.until(0, "turn 2's result", isResult(2))
	checkSequential(t, w, 2)
	if got := turnText(w, 1); got != "The command printed first." {
		t.Errorf("turn 1 answered %q", got)
	}
	reqs := fake.Requests()
	if len(reqs) != 3 || reqs[1].ToolResults[0].Content != "first" || reqs[2].UserText != "second message" {
		t.Errorf("the model saw %s", mustJSON(reqs))
	}

	for i := range 10 {
		fake.Script(fakemodel.Reply{Text: fmt.Sprintf("answer %d", i+1)})
	}
	for i := range 10 {
		if n := f.send(id, fmt.Sprintf("burst %d", i+1)); n != i+3 {
			t.Fatalf("burst send %d was numbered turn %d", i+1, n)
		}
	}
	w.until(0, "turn 12's result", isResult(12))
	checkSequential(t, w, 12)
	for i := range 10 {
		if got, want := turnText(w, i+3), fmt.Sprintf("answer %d", i+1); got != want {
			t.Errorf("turn %d answered %q, want %q", i+3, got, want)
		}
	}
	for i, r := range fake.Requests()[3:] {
		if want := fmt.Sprintf("burst %d", i+1); r.UserText != want {
			t.Errorf("model request %d was for %q, want %q", i+4, r.UserText, want)
		}
	}
	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || !rec.QueuesPrompts || rec.Turn != 12 {
		t.Errorf("status: %s %v", mustJSON(rec), err)
	}
}

// A CLI that never reads its stdin never holds up anyone: a send larger
// than the pipe answers without waiting for the write, an interrupt and
// a close answer within their deadlines, the agent is stopped with a turn
// that says why, and no process remains; a close while the write waits
// ends the agent too. A small turn that fits the pipe is ended by the
// watchdog, which climbs the stop ladder when the interrupt changes
// nothing.
func TestCLIThatStopsReading(t *testing.T) {
	t.Parallel()
	deaf := func(t *testing.T, idle time.Duration) *fixture {
		cli := fakeCLI("deaf")
		// Long enough that the interrupt or close sent right after a send
		// reaches the node while the write still waits, on a loaded
		// machine too; short enough to keep the test quick.
		cli.WriteTimeout = 3 * time.Second
		return startNode(t, fixtureOptions{claude: cli, node: func(c *node.Config) {
			c.TurnIdleTimeout, c.InterruptGrace = idle, 500*time.Millisecond
		}})
	}

	t.Run("a send larger than the pipe", func(t *testing.T) {
		t.Parallel()
		f := deaf(t, time.Minute)
		id := f.open(schemas.OpenRequest{})
		w := f.watch(id)
		pid := pidOf(t, f, id)
		// The deadline guards against a hang only: 4 MiB through the race
		// detector on a loaded machine takes seconds to encode, carry and
		// check, while a send that waited on the pipe would never answer
		// before the write gave up and stopped the agent, which the
		// interrupt below would then find dead.
		if rep, err := f.fabric.Send(f.ctx(30*time.Second), schemas.SendRequest{AgentID: id, Text: strings.Repeat("x", 4<<20)}); err != nil || rep.Turn != 1 {
			t.Fatalf("send: %+v %v", rep, err)
		}
		if rep, err := f.fabric.Interrupt(f.ctx(5*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !rep.Interrupted {
			t.Fatalf("interrupt: %+v %v", rep, err)
		}
		w.until(0, "status dead", isStatus(schemas.StatusDead))
		if rep, err := f.fabric.Close(f.ctx(5*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !rep.Closed {
			t.Fatalf("close: %+v %v", rep, err)
		}
		if stop, errs := stopOf(w, 1), turnErrors(w, 1); stop != schemas.StopCancelled || len(errs) != 1 || !strings.Contains(errs[0], "the agent stopped reading its input") {
			t.Errorf("turn 1 ended %s with %q", stop, errs)
		}
		poll.Until(t, 10*time.Second, "no process of the agent is left", func() bool { return gone(pid) })
	})
	t.Run("a close while a write waits", func(t *testing.T) {
		t.Parallel()
		f := deaf(t, time.Minute)
		id := f.open(schemas.OpenRequest{})
		w := f.watch(id)
		pid := pidOf(t, f, id)
		f.send(id, strings.Repeat("y", 4<<20))
		if rep, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !rep.Closed {
			t.Fatalf("close: %+v %v", rep, err)
		}
		w.until(0, "status dead", isStatus(schemas.StatusDead))
		if stop, errs := stopOf(w, 1), turnErrors(w, 1); stop != schemas.StopCancelled || len(errs) != 1 || errs[0] != "the agent was closed during turn 1" {
			t.Errorf("turn 1 ended %s with %q", stop, errs)
		}
		poll.Until(t, 10*time.Second, "no process of the agent is left", func() bool { return gone(pid) })
	})
	t.Run("the watchdog", func(t *testing.T) {
		t.Parallel()
		f := deaf(t, 500*time.Millisecond)
		id := f.open(schemas.OpenRequest{})
		w := f.watch(id)
		pid := pidOf(t, f, id)
		ran := make(chan error, 1)
		go func() {
			_, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "hello?"})
			ran <- err
		}()
		w.until(0, "status dead", isStatus(schemas.StatusDead))
		errs := turnErrors(w, 1)
		if stopOf(w, 1) != schemas.StopCancelled || len(errs) != 2 || errs[0] != "turn 1 produced no output for 500ms; interrupting it" ||
			errs[1] != "turn 1 was stopped: produced no output for 500ms, and it did not end within 500ms of the interrupt" {
			t.Errorf("the watchdog's turn: %q %s", errs, strings.Join(w.summary(0), " "))
		}
		if err := <-ran; schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "died during the turn") {
			t.Errorf("the run: %v", err)
		}
		poll.Until(t, 10*time.Second, "no process of the agent is left", func() bool { return gone(pid) })
	})
}

// An answer larger than the server's message limit comes back from a run
// cut, with the marker the stream uses, instead of a lost reply.
func TestRunAnswerLargerThanAMessage(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("huge")})
	id := f.open(schemas.OpenRequest{})
	rep, err := f.fabric.Run(f.ctx(90*time.Second), schemas.RunRequest{AgentID: id, Text: "say a lot"})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !rep.Truncated || rep.DroppedBytes == 0 || !strings.HasPrefix(rep.Text, "big answer big answer") ||
		!strings.HasSuffix(rep.Text, schemas.TruncationMarker(rep.DroppedBytes)) || len(rep.Text) > 8<<20 {
		t.Errorf("the run's answer: %d bytes, truncated %v, %d dropped, ends %q", len(rep.Text), rep.Truncated, rep.DroppedBytes, rep.Text[max(0, len(rep.Text)-80):])
	}
	if len(rep.Text)+rep.DroppedBytes != len(strings.Repeat("big answer ", 2<<20))+len(schemas.TruncationMarker(rep.DroppedBytes)) {
		t.Errorf("kept %d and dropped %d bytes of %d", len(rep.Text), rep.DroppedBytes, len(strings.Repeat("big answer ", 2<<20)))
	}
}

// agent_status points at the transcript the real CLI writes, for a cwd
// whose name the CLI has to rewrite (an underscore, a dot, a space).
func TestRealClaudeTranscriptPath(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	home := t.TempDir()
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(home, fake.URL()), StopWait: time.Second}})
	cwd := filepath.Join(t.TempDir(), "my_project.v2 (copy)")
	if err := os.Mkdir(cwd, 0o755); err != nil {
		t.Fatal(err)
	}
	id := f.open(schemas.OpenRequest{CWD: cwd})
	if _, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "hello"}); err != nil {
		t.Fatal(err)
	}
	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || rec.Transcript == nil {
		t.Fatalf("status: %s %v", mustJSON(rec), err)
	}
	poll.Until(t, 10*time.Second, "the transcript "+*rec.Transcript+" exists", func() bool {
		_, err := os.Stat(*rec.Transcript)
		return err == nil
	})
}

// A turn held behind a running one and dropped by an interrupt: the run
// that waited on it says it never began, and why, not that it was
// interrupted before it ended. A close with one turn running and two held
// says status closed on the running turn, not on the last held one.
func TestHeldTurnsTellTheTruth(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("chatty")})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	f.send(id, "go on")
	w.until(0, "turn 1 streams", func(ev schemas.Event) bool { return ev.Turn == 1 && ev.IsDelta() })
	ran := make(chan schemas.RunReply, 1)
	go func() {
		rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "held"})
		if err != nil {
			t.Errorf("the held run: %v", err)
		}
		ran <- rep
	}()
	poll.Until(t, 10*time.Second, "turn 2 is held", func() bool {
		rec, err := f.fabric.Record(f.ctx(5*time.Second), id)
		return err == nil && rec.Turn == 2 && rec.Held == 1
	})
	if _, err := f.fabric.Interrupt(f.ctx(10*time.Second), schemas.AgentRequest{AgentID: id}); err != nil {
		t.Fatal(err)
	}
	rep := <-ran
	if rep.Turn != 2 || rep.StopReason != schemas.StopCancelled || rep.NotBegun != "turn 2 was interrupted before it began" {
		t.Errorf("the run of the dropped held turn: %+v", rep)
	}
	w.until(0, "turn 2's result", isResult(2))

	f.send(id, "go on again") // turn 3 runs
	w.until(0, "turn 3 streams", func(ev schemas.Event) bool { return ev.Turn == 3 && ev.IsDelta() })
	f.send(id, "held 4")
	f.send(id, "held 5")
	if _, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil {
		t.Fatal(err)
	}
	ev := w.events()[w.until(0, "status closed", isStatus(schemas.StatusClosed))]
	if ev.Turn != 3 {
		t.Errorf("status closed carries turn %d; the agent was on turn 3 (4 and 5 held)", ev.Turn)
	}
	// The running turn says it was closed, as it does for every backend
	// (the claude CLI ends it itself at the end of its input; it said
	// nothing), and nothing else: no parse error of a line cut short.
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	if errs := turnErrors(w, 3); len(errs) != 1 || errs[0] != "the agent was closed during turn 3" {
		t.Errorf("turn 3's errors: %q", errs)
	}
}

// The real claude CLI closed mid-turn: the turn says the agent was closed
// during it, as an ACP agent's does, and nothing else is published (no
// parse error of the line the CLI was cut off in).
func TestRealClaudeClosedMidTurn(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: strings.Repeat("slowly ", 400), ChunkSize: 7, Delay: 50 * time.Millisecond})
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	f.send(id, "Take your time.")
	w.until(0, "the answer streams", func(ev schemas.Event) bool { return ev.Turn == 1 && ev.IsDelta() })
	if _, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil {
		t.Fatal(err)
	}
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	var all []string
	for _, e := range w.events() {
		if p, ok := e.Payload.(schemas.Error); ok {
			all = append(all, fmt.Sprintf("%d: %s", e.Turn, p.Message))
		}
	}
	if len(all) != 1 || all[0] != "1: the agent was closed during turn 1" {
		t.Errorf("the errors on the stream: %q", all)
	}
}

// A claude CLI stopped by a close is cut off in the middle of a line: the
// half line is not read as one, so no parse error reaches the stream.
func TestClosedCLIHalfLineIsNoError(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("halfline")})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	if _, err := f.fabric.Run(f.ctx(30*time.Second), schemas.RunRequest{AgentID: id, Text: "hello"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil {
		t.Fatal(err)
	}
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	for _, e := range w.events() {
		if p, ok := e.Payload.(schemas.Error); ok {
			t.Errorf("an error on the stream of a cleanly closed agent: %s", p.Message)
		}
	}
}

// A CLI that cannot start at all (a sandbox that cannot find it, a binary
// that exits at once) is no interrupted turn: the run of the agent's
// first turn says the agent died (during the turn, as the turn was sent,
// or before it, as the race with its exit goes), every time, never that
// its turn was cancelled or that the agent was closed.
func TestRunOfACLIThatNeverStartsSaysItDied(t *testing.T) {
	t.Parallel()
	cli := filepath.Join(t.TempDir(), "claude")
	if err := os.WriteFile(cli, []byte("#!/bin/sh\n[ \"$1\" = --version ] && echo '2.1.197 (Claude Code)' && exit 0\n[ \"$1\" = auth ] && echo '{\"loggedIn\": true}' && exit 0\necho 'shoal sandbox: claude is not found; the agent does not run' >&2\nexit 126\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: cli, StopWait: 500 * time.Millisecond}})
	for i := range 10 {
		id := f.open(schemas.OpenRequest{})
		rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "hello"})
		died := []string{"agent '" + id + "' died during the turn", "agent '" + id + "' died as the turn was sent", "agent '" + id + "' is dead"}
		if schemas.CodeOf(err) != schemas.CodeUnavailable || !slices.Contains(died, err.Error()) {
			t.Errorf("run %d of a CLI that exits at once: %+v %v, want that the agent died", i, rep, err)
		}
	}
}
