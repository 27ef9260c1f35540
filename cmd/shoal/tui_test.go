package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/proctest"
	"github.com/shoalfabric/shoal/schemas"
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
			// The whole scrollback, if the pane is still there: a report
			// longer than the screen (a race detector's) starts above it.
			if out, err := exec.Command("tmux", "-L", s.socket, "capture-pane", "-p", "-S", "-", "-t", "tui").Output(); err == nil {
				t.Logf("the pane's whole history:\n%s", out)
			}
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

// typeText types text as it is, not as key names.
func (s *screen) typeText(text string) {
	s.t.Helper()
	s.keys("-l", text)
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

	// The transcript, from the stream. (From the feed: a t sent right
	// behind an escape would read as alt+t.)
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
	poll.Until(t, 30*time.Second, "the agent is dead", func() bool {
		out := p.must("status", "watched")
		return json.Unmarshal([]byte(out), &rec) == nil && rec.Status == "dead"
	})

	scr.keys("n")
	scr.wait("both nodes", func(s string) bool {
		return strings.Contains(s, "NODE") && strings.Contains(s, "n1") && strings.Contains(s, "n2")
	})
	scr.keys("q")
}

// The monitor acts: it opens an agent from its form, sends it a turn
// whose long answer the transcript wraps to the screen, interrupts a turn
// running a 40-second tool after asking, and shows the reason the agent
// could not switch models.
func TestTUIActs(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.node("n1")
	var words []string
	for i := range 70 {
		words = append(words, fmt.Sprintf("w%02d", i))
	}
	long := "START-OF-ANSWER " + strings.Join(words, " ") + " END-OF-ANSWER"
	p.fake.Script(
		fakemodel.Reply{Text: long},
		fakemodel.Reply{Text: "Waiting.", ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"sleep 40","description":"wait for the interrupt"}`)}}},
		fakemodel.Reply{Text: "never"},
	)
	scr := startTUI(t, append(baseEnv(t.TempDir()), "SHOAL_NATS="+p.url))
	scr.waitText("no agents yet")

	// Open, from the form.
	dir := t.TempDir()
	scr.keys("o")
	scr.waitText("open an agent")
	scr.keys("C-u")
	scr.typeText(dir)
	scr.keys("Enter")
	opened := regexp.MustCompile(`opened (\S+) on n1`)
	var id string
	scr.wait("the open's outcome", func(s string) bool {
		if m := opened.FindStringSubmatch(s); m != nil {
			id = m[1]
			return true
		}
		return false
	})
	var rec schemas.AgentRecord
	if err := json.Unmarshal([]byte(p.must("status", "--json", id)), &rec); err != nil || rec.CWD != dir || rec.Model != "sonnet" {
		t.Fatalf("the agent opened from the monitor: %+v (%v)", rec, err)
	}
	scr.wait("the agent selected and idle", func(s string) bool { return strings.Contains(s, "agent "+id) && strings.Contains(s, "idle") })

	// Send a turn; its answer is longer than the screen is wide.
	scr.keys("s")
	scr.waitText("send a turn to " + id)
	scr.typeText("Say the long answer.")
	scr.keys("Enter")
	scr.waitText("sent turn 1 to " + id)
	scr.wait("the turn's end in the feed", func(s string) bool {
		return strings.Contains(s, "» Say the long answer.") && strings.Contains(s, "turn 1 ended: end_turn")
	})

	// The transcript wraps it: its first and last words are on screen,
	// on different lines.
	scr.keys("t")
	final := scr.wait("the wrapped answer", func(s string) bool {
		return strings.Contains(s, "transcript of "+id) && strings.Contains(s, "START-OF-ANSWER") && strings.Contains(s, "END-OF-ANSWER")
	})
	var text []string
	for _, l := range strings.Split(final, "\n") {
		if strings.Contains(l, "START-OF-ANSWER") || len(text) > 0 && len(text) < 10 && strings.Contains(l, " w") {
			text = append(text, strings.TrimSpace(strings.TrimLeft(l, "› +−")))
		}
		if strings.Contains(l, "END-OF-ANSWER") {
			break
		}
	}
	if len(text) < 2 || strings.Join(text, " ") != long {
		t.Fatalf("the transcript shows the answer as %q, want it wrapped over lines", text)
	}
	scr.keys("Escape")
	scr.wait("the transcript closed", func(s string) bool { return !strings.Contains(s, "transcript of") })

	// Interrupt a turn running a long tool: the monitor asks, then the
	// turn ends cancelled.
	scr.keys("s")
	scr.waitText("send a turn to " + id)
	scr.typeText("Wait a while.")
	scr.keys("Enter")
	scr.waitText("▶ Bash sleep 40")
	poll.Until(t, time.Minute, "the tool runs", func() bool { return proctest.Sleep("40") > 0 })
	scr.keys("i")
	scr.waitText("Interrupt agent " + id + "'s turn 2?")
	scr.keys("y")
	scr.waitText("interrupted " + id + "'s turn")
	scr.waitText("turn 2 ended: cancelled")
	poll.Until(t, time.Minute, "the tool is gone", func() bool { return proctest.Sleep("40") == 0 })

	// Set the model: the node's reason comes back.
	scr.keys("m")
	scr.waitText("set the model of " + id)
	scr.keys("C-u")
	scr.typeText("opus")
	scr.keys("Enter")
	scr.waitText("did not switch: claude CLI agents cannot switch models in place")
	scr.keys("q")
}

// The monitor, with a client's credentials (so its feed is a replay the
// coordinator streams), survives a restart of the coordinator under it:
// it says it reconnects, then the feed shows the next turn's events after
// the ones it had, none lost and none twice.
func TestTUIReconnectsAfterARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authDir := filepath.Join(dir, "keys")
	creds := map[string]string{}
	for _, c := range [][2]string{{"node", "box"}, {"client", "cli"}} {
		path := filepath.Join(dir, c[1]+".creds")
		if code, _, errOut := runShoal(t, dir, nil, "creds", c[0], c[1], "--out", path, "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
		creds[c[1]] = path
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	url := "nats://127.0.0.1:" + port
	coordinator := func() *shoalProc {
		up := startShoal(t, dir, nil, "up", "--auth", "--auth-dir", authDir, "--port", port, "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", "2s")
		up.waitLine("shoal: ready")
		return up
	}
	up := coordinator()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: "Said before the restart."}, fakemodel.Reply{Text: "Said after the restart."})
	home := filepath.Join(dir, "box")
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	startShoal(t, home, env, "node", "--nats", url, "--creds", creds["box"], "--name", "box", "--claude", peers.Claude.Command(t)[0], "--stop-wait", "500ms").
		waitLine("shoal: node box joined")
	client := []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + creds["cli"]}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), client, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s%s", args, code, out, errOut)
		}
		return strings.TrimSpace(out)
	}

	scr := startTUI(t, append(baseEnv(t.TempDir()), client...))
	must("open", "--id", "steady", t.TempDir())
	scr.wait("the agent", func(s string) bool { return strings.Contains(s, "steady") && strings.Contains(s, "idle") })
	must("send", "steady", "Before.")
	scr.waitText("Said before the restart.")
	scr.waitText("turn 1 ended")

	up.stop(syscall.SIGTERM)
	scr.waitText("reconnecting…")
	coordinator()
	scr.wait("the feed back", func(s string) bool { return !strings.Contains(s, "reconnecting…") })
	poll.Until(t, time.Minute, "a send after the restart", func() bool {
		code, _, _ := runShoal(t, t.TempDir(), client, "send", "steady", "After.")
		return code == 0
	})
	final := scr.wait("the next turn in the feed", func(s string) bool {
		return strings.Contains(s, "Said after the restart.") && strings.Contains(s, "turn 2 ended")
	})
	for _, once := range []string{"» Before.", "Said before the restart.", "turn 1 ended", "» After.", "Said after the restart.", "turn 2 ended"} {
		if n := strings.Count(final, once); n != 1 {
			t.Errorf("the feed shows %q %d times", once, n)
		}
	}
	if strings.Index(final, "turn 1 ended") > strings.Index(final, "» After.") {
		t.Errorf("the feed is out of order:\n%s", final)
	}
	scr.keys("q")
}

// A permission request answered from the monitor: the agent under
// --permission ask waits, the monitor marks it, shows the request with
// the tool's input, and its allow lets the tool run and the turn end.
func TestTUIAnswersAPermissionRequest(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.node("n1")
	dir := t.TempDir()
	target := filepath.Join(dir, "from-the-monitor.txt")
	in, _ := json.Marshal(map[string]string{"command": "touch " + target, "description": "make the file"})
	p.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Made it."})
	id := strings.TrimSpace(p.must("open", "--permission", "ask", dir))
	p.must("send", id, "Make the file.")
	scr := startTUI(t, append(baseEnv(t.TempDir()), "SHOAL_NATS="+p.url))
	scr.waitText("⚠ 1 waiting")
	scr.keys("p")
	scr.wait("the request in full", func(s string) bool {
		return strings.Contains(s, "tool         Bash") && strings.Contains(s, "from-the-monitor.txt")
	})
	scr.keys("a")
	scr.waitText("allowed Bash for " + id)
	poll.Until(t, 60*time.Second, "the turn ends", func() bool { return strings.TrimSpace(p.must("output", id)) == "Made it." })
	if _, err := readFile(target); err != nil {
		t.Errorf("the allowed tool did not run: %v", err)
	}
	var rep schemas.PendingReply
	json.Unmarshal([]byte(p.must("pending", "--json")), &rep)
	if len(rep.Requests) != 0 {
		t.Errorf("still pending: %+v", rep.Requests)
	}
}

// Without a terminal (input from /dev/null, a character device but no
// terminal), shoal tui exits 2 with one line, drawing nothing.
func TestTUIWithoutATerminal(t *testing.T) {
	t.Parallel()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	cmd := exec.Command(os.Args[0], "tui", "--nats", "nats://127.0.0.1:1")
	cmd.Env = baseEnv(t.TempDir())
	cmd.Stdin = null
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Run()
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	if code := cmd.ProcessState.ExitCode(); code != 2 || len(lines) != 1 || !strings.Contains(lines[0], "shoal tui needs a terminal") ||
		strings.Contains(out.String()+errb.String(), "\x1b") {
		t.Errorf("shoal tui </dev/null: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
