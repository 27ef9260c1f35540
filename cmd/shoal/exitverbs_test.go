package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/proctest"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// A verb that did not do what it was asked exits nonzero with the one
// reason that applies; tail --json says where each event stands, and a
// tail resumed from the next number gives exactly the rest. Against the
// real claude CLI.
func TestVerbsFailLoudlyAndTailResumes(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--no-mcp", "--no-bus", "--claude", peers.Claude.Command(t)[0], "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + url}
	shoal := func(args ...string) (int, string, string) {
		t.Helper()
		return runShoal(t, t.TempDir(), client, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := shoal(args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	fails := func(code int, says string, args ...string) {
		t.Helper()
		got, _, errOut := shoal(args...)
		if got != code || !strings.Contains(errOut, says) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("shoal %s: exit %d, %q; want exit %d and one line saying %q", strings.Join(args, " "), got, errOut, code, says)
		}
	}
	id := strings.TrimSpace(must("open", "--permission", "bypass", t.TempDir()))
	fake.Script(fakemodel.Reply{Text: "Hello there."})
	if out := strings.TrimSpace(must("run", id, "Hi")); out != "Hello there." {
		t.Fatalf("run: %q", out)
	}

	fails(exitError, "not switched: claude CLI agents cannot switch models in place", "set-model", id, "opus")
	fails(exitNotFound, "has no turn 99 (it has turns 1 to 1)", "output", "--turn", "99", id)
	fails(exitNotFound, "event 500 is past the end", "tail", "--from", "500", id)
	fails(exitNotFound, "event 500 is past the end", "tail", "--no-follow", "--from", "500", id)

	// --json: every line names the agent, its number (gapless from 1),
	// the node and the time, beside the envelope.
	lines := strings.Split(strings.TrimSpace(must("tail", "--json", "--no-follow", id)), "\n")
	if len(lines) < 6 {
		t.Fatalf("tail --json printed %d lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, l := range lines {
		var ev struct {
			Agent string          `json:"agent_id"`
			N     uint64          `json:"event"`
			Node  string          `json:"node"`
			Time  time.Time       `json:"time"`
			Kind  string          `json:"kind"`
			Turn  *int            `json:"turn"`
			Data  json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Agent != id || ev.N != uint64(i+1) || ev.Node != "n" ||
			ev.Time.IsZero() || time.Since(ev.Time) > 5*time.Minute || ev.Kind == "" || ev.Turn == nil || len(ev.Data) == 0 {
			t.Fatalf("tail --json line %d: %s (%v)", i+1, l, err)
		}
	}
	// Resume after the third: exactly the rest, byte for byte.
	rest := strings.Split(strings.TrimSpace(must("tail", "--json", "--no-follow", "--from", "4", id)), "\n")
	if strings.Join(rest, "\n") != strings.Join(lines[3:], "\n") {
		t.Errorf("resumed from 4:\n%s\nwant:\n%s", strings.Join(rest, "\n"), strings.Join(lines[3:], "\n"))
	}
	// --raw is the envelope as stored; --numbers starts each line with it.
	raw := strings.Split(strings.TrimSpace(must("tail", "--raw", "--no-follow", id)), "\n")
	if len(raw) != len(lines) || !strings.HasPrefix(raw[0], `{"kind":`) {
		t.Errorf("tail --raw: %q", raw)
	}
	numbered := must("tail", "--numbers", "--no-follow", id)
	if !regexp.MustCompile(`(?m)^ +\d+ » Hi$`).MatchString(numbered) || !regexp.MustCompile(`(?m)^ +\d+ Hello there\.$`).MatchString(numbered) {
		t.Errorf("tail --numbers:\n%s", numbered)
	}
	fails(exitUsage, "give one", "tail", "--raw", "--json", id)
	fails(exitUsage, "--wait 0s", "run", "--wait", "0", id, "hi")
	fails(exitUsage, "--timeout 0s: a request waits for more than no time", "status", "--timeout", "0", id)
	// Flags are named as the help writes them, and a stray argument
	// says where to look.
	fails(exitUsage, `invalid value "-1s" for flag --wait: "-1s" is negative`, "run", "--wait", "-1s", id, "hi")
	fails(exitUsage, `invalid value "abc" for flag --turn: parse error: want an integer`, "output", "--turn", "abc", id)
	fails(exitUsage, `unexpected argument "extra" (see shoal status --help)`, "status", id, "extra")
	fails(exitUsage, "--wait 25h0m0s: a run waits at most 24h0m0s", "run", "--wait", "25h", id, "hi")

	// A run whose turn is interrupted prints what it has and exits 7.
	cmd := "sleep 37 && echo late"
	in, _ := json.Marshal(map[string]string{"command": cmd, "description": "wait"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "never"})
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runShoal(t, t.TempDir(), client, "run", id, "Wait a while.")
		done <- result{code, out, errOut}
	}()
	poll.Until(t, time.Minute, "the tool runs", func() bool { return proctest.Sleep("37") > 0 })
	must("interrupt", id)
	select {
	case r := <-done:
		if r.code != exitCancelled || !strings.Contains(r.err, "turn 2 was interrupted") {
			t.Errorf("an interrupted run: exit %d, stdout %q, stderr %q", r.code, r.out, r.err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the interrupted run did not return")
	}
}
