package node_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// The real claude CLI (pinned, offline against the fake model server)
// driven through the node: a turn with thinking and a Bash call produces
// Kaimon's envelope sequence, a second turn works, an interrupt ends a turn
// cancelled and the agent takes the next, and close leaves no process.
func TestRealClaude(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(
		fakemodel.Reply{
			Thinking:  "I should run a command.",
			Text:      "I'll run a command.",
			ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"echo shoal-ok","description":"Print a marker"}`)}},
		},
		fakemodel.Reply{Text: "The command printed shoal-ok."},
		fakemodel.Reply{Text: "Second answer."},
		fakemodel.Reply{Text: strings.Repeat("tick ", 80), ChunkSize: 5, Delay: 100 * time.Millisecond},
		fakemodel.Reply{Text: "Back again."},
	)
	f := startNode(t, fixtureOptions{claude: claude.Config{
		Path:     argv[0],
		Env:      peers.ClaudeEnv(t.TempDir(), fake.URL()),
		StopWait: time.Second,
	}})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)

	f.send(id, "Check the machine.")
	end := w.until(0, "turn 1's result", isResult(1))
	got := strings.Join(w.summary(0), " ")
	want := "status:idle@0 user_text@0 status:working@1 turn_started@1 thought+@1 thought@1 assistant_text+@1 assistant_text@1 " +
		"tool_use@1 tool_input_delta+@1 tool_use@1 tool_result@1 assistant_text+@1 assistant_text@1 status:idle@1 result@1"
	if got != want {
		t.Fatalf("turn 1 events\n got %s\nwant %s", got, want)
	}
	var calls []schemas.ToolCall
	for _, e := range w.events()[:end+1] {
		switch p := e.Payload.(type) {
		case schemas.Thought:
			if !p.Delta && p.Content.Text != "I should run a command." {
				t.Errorf("authoritative thought %q: it should be rebuilt from the streamed thinking", p.Content.Text)
			}
		case schemas.ToolUse:
			calls = append(calls, p.Call)
		case schemas.ToolResult:
			if *p.Update.Status != schemas.ToolCompleted || !strings.Contains(p.Update.Content[0].Content.Text, "shoal-ok") {
				t.Errorf("tool result %s", mustJSON(p.Update))
			}
		case schemas.Result:
			if p.StopReason != schemas.StopEndTurn || p.Usage == nil || p.Usage.InputTokens == 0 || p.Usage.OutputTokens == 0 {
				t.Errorf("result %s", mustJSON(p))
			}
		}
	}
	if len(calls) != 2 || calls[0].ToolCallID != calls[1].ToolCallID || calls[0].RawInput != nil ||
		!strings.Contains(string(calls[1].RawInput), "echo shoal-ok") || calls[1].Kind != schemas.ToolExecute {
		t.Errorf("tool calls %s", mustJSON(calls))
	}

	rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "Second turn."})
	if err != nil || rep.Text != "Second answer." {
		t.Fatalf("second turn: %+v %v", rep, err)
	}
	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || rec.SessionID == "" || rec.Transcript == nil || !strings.HasSuffix(*rec.Transcript, rec.SessionID+".jsonl") || rec.Turn != 2 {
		t.Errorf("status %s %v", mustJSON(rec), err)
	}

	f.send(id, "Take your time.")
	w.until(end, "turn 3 streaming", func(ev schemas.Event) bool { return ev.Turn == 3 && ev.IsDelta() })
	if ir, err := f.fabric.Interrupt(f.ctx(10*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !ir.Interrupted {
		t.Fatalf("interrupt: %+v %v", ir, err)
	}
	i := w.until(end, "turn 3's result", isResult(3))
	if r := w.events()[i].Payload.(schemas.Result); r.StopReason != schemas.StopCancelled {
		t.Errorf("the interrupted turn ended %s", r.StopReason)
	}
	rep, err = f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "After the interrupt."})
	if err != nil || rep.Text != "Back again." {
		t.Fatalf("the turn after the interrupt: %+v %v", rep, err)
	}
	if errs := errorsOf(w.events()); len(errs) != 0 {
		t.Errorf("errors: %q", errs)
	}
	reqs := fake.Requests()
	if len(reqs) != 5 || reqs[4].UserText != "After the interrupt." || reqs[1].ToolResults[0].Content != "shoal-ok" {
		t.Errorf("the model saw %d requests: %s", len(reqs), mustJSON(reqs))
	}

	pid := pidOf(t, f, id)
	if r, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !r.Closed {
		t.Fatalf("close: %+v %v", r, err)
	}
	w.until(i, "status dead", isStatus(schemas.StatusDead))
	poll.Until(t, 10*time.Second, "no claude process is left", func() bool { return gone(pid) })
}
