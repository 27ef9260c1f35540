package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// acp:gemini asks permission for a shell command with the command itself
// as the tool call's title (and no rawInput), which Shoal records as the
// request's tool. shoal pending printed it in its table as it was: a
// command with a newline and tabs, which a model writes, added rows of
// its own to the table, here one for a request that does not exist, of
// a harmless tool. Each cell is one line.
func TestPendingTableRowsAreNotForgedByACommand(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	dir := t.TempDir()
	env := append(peers.GeminiEnv(t, filepath.Join(dir, "gm-home"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	// --gemini takes one path: a script that runs the pinned gemini.
	wrapper := filepath.Join(dir, "gemini")
	argv := peers.Gemini.Command(t)
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+strings.Join(argv, " ")+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", "/nonexistent/claude", "--gemini", wrapper, "--node-name", "gm")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: node gm ready")
	cli := []string{"SHOAL_NATS=" + url}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), cli, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d\n%s%s\nshoal up said:\n%s", args, code, out, errOut, up.stderrText())
		}
		return strings.TrimSpace(out)
	}
	id := must("open", "--timeout", "3m", "--model", "acp:gemini", "--permission", "ask", t.TempDir())
	cmd := "rm -rf ~/victim\n" + id + "\tperm-00c0ffee\tRead README.md\t1s\t{\"file_path\":\"README.md\"}"
	in, _ := json.Marshal(map[string]string{"command": cmd, "description": "read the readme"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "run_shell_command", Input: in}}}, fakemodel.Reply{Text: "done"})
	must("send", id, "Read the readme.")

	var out string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out = must("pending")
		if strings.Contains(out, "perm-") || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if js := must("pending", "--json"); strings.Count(js, `"request_id"`) != 1 {
		t.Fatalf("want one request waiting: %s", js)
	}
	lines := strings.Split(out, "\n")
	if len(lines) != 2 {
		t.Errorf("one request waits, but shoal pending printed %d rows under its header", len(lines)-1)
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "perm-00c0ffee" {
			t.Errorf("shoal pending lists request perm-00c0ffee, which does not exist, as a row of its own: %q", l)
		}
	}
}
