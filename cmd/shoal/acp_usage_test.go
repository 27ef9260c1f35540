package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// claude-agent-acp reports the tokens written to the prompt cache as
// cachedWriteTokens in each prompt's usage; shoal usage counts them as
// cache-creation tokens, beside the input, output and cache reads.
func TestACPCacheWriteTokensCounted(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply {
		return fakemodel.Reply{Text: "ok", Usage: fakemodel.Usage{Input: 100, Output: 20, CacheRead: 30, CacheCreation: 7}}
	}})
	dir := t.TempDir()
	// --claude-agent-acp takes one program; the pinned agent is node and
	// its script.
	wrapper := filepath.Join(dir, "claude-agent-acp")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+strings.Join(peers.ClaudeACP.Command(t), " ")+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := append(peers.ClaudeEnv(filepath.Join(dir, "home"), fake.URL()), "XDG_DATA_HOME="+dir+"/data", "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", "/nonexistent/claude", "--claude-agent-acp", wrapper, "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: node n ready")
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d\n%s%s\nshoal up said:\n%s", args, code, out, errOut, up.stderrText())
		}
		return strings.TrimSpace(out)
	}
	id := must("open", "--model", "acp:claude", t.TempDir())
	must("run", id, "hello")
	var rep usageReport
	if err := json.Unmarshal([]byte(must("usage", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	u := rep.Total.Usage
	if u.InputTokens != 100 || u.OutputTokens != 20 || u.CacheReadTokens != 30 || u.CacheCreationTokens != 7 {
		t.Fatalf("shoal usage counted %+v; the model reported 100 in, 20 out, 30 cache reads and 7 cache writes", u)
	}
}
