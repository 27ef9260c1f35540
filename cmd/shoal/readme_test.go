package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// quickStart returns the shell blocks of the README's quick start, in
// order, each as its command lines with their comments dropped.
func quickStart(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "<!-- quickstart")
	end := strings.Index(text, "<!-- /quickstart -->")
	if start < 0 || end < start {
		t.Fatal("the README has no quick start between <!-- quickstart --> and <!-- /quickstart -->")
	}
	var blocks [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(text[start:end]))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case !in && l == "```sh":
			in, cur = true, nil
		case in && l == "```":
			in = false
			blocks = append(blocks, cur)
		case in:
			if i := strings.Index(l, "  #"); i >= 0 {
				l = l[:i]
			}
			if l = strings.TrimSpace(l); l != "" {
				cur = append(cur, l)
			}
		}
	}
	if len(blocks) != 2 {
		t.Fatalf("the quick start has %d shell blocks; this test knows two (install and start, then drive)", len(blocks))
	}
	return blocks
}

// The README's quick start, run as written: the install line names this
// command's package, `shoal up` starts with the flags shown (plus the
// test's loopback ports and pinned claude CLI), and the second block runs
// as a bash script with `shoal` and `claude` on PATH — Claude Code's
// `claude mcp add` included, after which `claude mcp list` finds Shoal's
// endpoint connected.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	blocks := quickStart(t)
	install, start := blocks[0], blocks[1]
	if len(install) != 2 || install[0] != "go install ./cmd/shoal" || !strings.HasPrefix(install[1], "shoal up") {
		t.Fatalf("the first block is %q; this test knows `go install ./cmd/shoal` then `shoal up`", install)
	}
	if _, err := os.Stat("main.go"); err != nil {
		t.Fatalf("./cmd/shoal is not the shoal command: %v", err)
	}

	fake := fakemodel.Start(t, fakemodel.Config{})
	home := t.TempDir()
	claudeArgv := peers.Claude.Command(t)
	env := append(peers.ClaudeEnv(home, fake.URL()), "XDG_CACHE_HOME="+home+"/.cache")
	upArgs := append(strings.Fields(install[1])[1:], "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus", "--claude", claudeArgv[0])
	up := startShoal(t, home, env, upArgs...)
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	endpoint := strings.TrimPrefix(up.waitLine("shoal: MCP endpoint "), "shoal: MCP endpoint ")
	up.waitLine("shoal: ready")

	bin := t.TempDir()
	if err := os.Symlink(os.Args[0], filepath.Join(bin, "shoal")); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\nexec " + strings.Join(claudeArgv, " ") + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "claude"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(home, "src", "myproject"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := strings.Join(start, "\n")
	const readmeURL = "http://127.0.0.1:7270/mcp"
	if !strings.Contains(script, readmeURL) {
		t.Fatalf("the quick start no longer connects Claude Code to %s:\n%s", readmeURL, script)
	}
	script = strings.ReplaceAll(script, readmeURL, endpoint)
	fake.Script(fakemodel.Reply{Text: "A fabric for coding agents."})
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = home
	cmd.Env = append(append(baseEnv(home), env...), "PATH="+bin+":"+os.Getenv("PATH"), "SHOAL_NATS="+url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the quick start failed: %v\n%s", err, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^A fabric for coding agents\.$`),           // shoal run
		regexp.MustCompile(`(?m)^» Summarize this project in one line\.$`), // shoal tail
		regexp.MustCompile(`turn 1 ended: end_turn`),
	} {
		if !want.Match(out) {
			t.Errorf("the quick start's output lacks %s:\n%s", want, out)
		}
	}
	list := exec.Command(filepath.Join(bin, "claude"), "mcp", "list")
	list.Dir = home
	list.Env = cmd.Env
	got, err := list.CombinedOutput()
	if err != nil || !regexp.MustCompile(`shoal: .*`+regexp.QuoteMeta(endpoint)+`.*Connected`).Match(got) {
		t.Errorf("claude mcp list after the quick start: %v\n%s", err, got)
	}
}
