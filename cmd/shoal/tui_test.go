package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// screen is `shoal tui` running in a tmux pane of its own server.
type screen struct {
	t      *testing.T
	socket string
	last   string
}

func startTUI(t *testing.T, env []string) *screen {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("this test drives shoal tui in tmux, which is not installed; the test command installs it (scripts/test)")
	}
	s := &screen{t: t, socket: fmt.Sprintf("shoal-tui-%d", time.Now().UnixNano())}
	var cmd strings.Builder
	cmd.WriteString("env -i")
	for _, kv := range env {
		cmd.WriteString(" " + shellQuote(kv))
	}
	cmd.WriteString(" TERM=xterm-256color " + shellQuote(os.Args[0]) + " tui --poll 300ms --silent 60s; sleep 60")
	if out, err := exec.Command("tmux", "-L", s.socket, "new-session", "-d", "-s", "tui", "-x", "140", "-y", "36", cmd.String()).CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last screen:\n%s", s.last)
		}
		exec.Command("tmux", "-L", s.socket, "kill-server").Run()
	})
	return s
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (s *screen) capture() string {
	out, err := exec.Command("tmux", "-L", s.socket, "capture-pane", "-p", "-t", "tui").Output()
	if err != nil {
		s.t.Fatalf("tmux capture-pane: %v", err)
	}
	s.last = string(out)
	return s.last
}

// wait waits until the screen satisfies ok.
func (s *screen) wait(what string, ok func(string) bool) string {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if scr := s.capture(); ok(scr) {
			return scr
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the monitor never showed %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *screen) waitText(text string) string {
	s.t.Helper()
	return s.wait(fmt.Sprintf("%q", text), func(scr string) bool { return strings.Contains(scr, text) })
}

func (s *screen) keys(keys ...string) {
	s.t.Helper()
	if out, err := exec.Command("tmux", append([]string{"-L", s.socket, "send-keys", "-t", "tui"}, keys...)...).CombinedOutput(); err != nil {
		s.t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
}

// The monitor, driven in a terminal against a live fabric of two nodes
// with a real claude agent: the agent appears, its status follows a turn,
// a tool call is one line with its result, enter shows an event in full,
// x closes the agent, and the nodes view lists both nodes.
func TestTUIWatchesTheFabric(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.node("n1")
	p.node("n2", "--claude", "/nonexistent/claude")
	p.fake.Script(
		fakemodel.Reply{Text: "Running it.", ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"echo tui-marker","description":"marker for the monitor"}`)}}},
		fakemodel.Reply{Text: strings.Repeat("slowly ", 60), ChunkSize: 7, Delay: 40 * time.Millisecond},
	)
	dir := t.TempDir()
	scr := startTUI(t, append(baseEnv(dir), "SHOAL_NATS="+p.url))
	scr.waitText("no agents yet")

	p.must("open", "--id", "watched", t.TempDir())
	scr.wait("the agent, idle", func(s string) bool { return strings.Contains(s, "watched") && strings.Contains(s, "idle") })

	p.must("send", "watched", "Run the marker.")
	scr.wait("the agent working", func(s string) bool { return strings.Contains(s, "working") })
	final := scr.wait("the turn's end", func(s string) bool {
		return strings.Contains(s, "turn 1 ended") && strings.Contains(s, "idle")
	})
	tools := 0
	for _, l := range strings.Split(final, "\n") {
		if strings.Contains(l, "▶ Bash echo tui-marker") {
			tools++
			if !strings.Contains(l, "→ completed") {
				t.Errorf("the tool line has no result: %q", l)
			}
		}
	}
	if tools != 1 {
		t.Fatalf("%d lines for the one tool call", tools)
	}

	// The feed, then the newest event in full.
	scr.keys("Tab")
	scr.keys("Enter")
	scr.wait("an event in full", func(s string) bool {
		return strings.Contains(s, `"kind": "result"`) && strings.Contains(s, "esc closes")
	})
	scr.keys("Escape")
	scr.wait("the event closed", func(s string) bool { return !strings.Contains(s, `"kind": "result"`) })
	scr.keys("Escape")

	// The transcript, from the stream.
	scr.keys("t")
	scr.wait("the transcript", func(s string) bool {
		return strings.Contains(s, "transcript of watched") && strings.Contains(s, "» Run the marker.")
	})
	scr.keys("Escape")
	// An x sent right behind the escape would read as alt+x.
	scr.wait("the transcript closed", func(s string) bool { return !strings.Contains(s, "transcript of watched") })

	// x asks, y closes.
	scr.keys("x")
	scr.waitText("Close agent watched")
	scr.keys("y")
	scr.wait("the agent closed", func(s string) bool { return strings.Contains(s, "dead") || strings.Contains(s, "closed") })
	var rec struct {
		Status string `json:"status"`
	}
	eventually(t, 30*time.Second, "the agent is dead", func() bool {
		out := p.must("status", "watched")
		return json.Unmarshal([]byte(out), &rec) == nil && rec.Status == "dead"
	})

	scr.keys("n")
	scr.wait("both nodes", func(s string) bool {
		return strings.Contains(s, "NODE") && strings.Contains(s, "n1") && strings.Contains(s, "n2")
	})
	scr.keys("q")
}
