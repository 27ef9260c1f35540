package main

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// Per-invocation flags come from the command line only: exported SHOAL_ID,
// SHOAL_JSON, SHOAL_TIMEOUT, SHOAL_NODE, SHOAL_LABELS and SHOAL_SANDBOX
// (the last three a node's settings of the same name) change nothing about
// an open. The node name is one setting, --node-name and SHOAL_NODE_NAME,
// for shoal up and shoal node alike; --name and SHOAL_NAME, its old
// spelling, are still read by shoal node, below it.
func TestSettingsAreNotArguments(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	dir := t.TempDir()
	claude := peers.Claude.Command(t)[0]
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude-home"), fake.URL()), "SHOAL_NODE_NAME=alpha")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--no-bus", "--no-mcp", "--claude", claude)
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: node alpha ready")

	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"SHOAL_NODE_NAME=beta"}, nil, "beta"},
		{[]string{"SHOAL_NAME=gamma"}, nil, "gamma"},
		{[]string{"SHOAL_NAME=old", "SHOAL_NODE_NAME=delta"}, nil, "delta"},
		{[]string{"SHOAL_NODE_NAME=beta"}, []string{"--node-name", "epsilon"}, "epsilon"},
		{nil, []string{"--name", "zeta"}, "zeta"},
	} {
		home := t.TempDir()
		args := append([]string{"node", "--nats", url, "--claude", "/nonexistent/claude"}, c.args...)
		n := startShoal(t, home, append(c.env, "XDG_CACHE_HOME="+home+"/cache"), args...)
		n.waitLine("shoal: node " + c.want + " joined")
		if code := n.stop(syscall.SIGTERM); code != 0 {
			t.Errorf("shoal node with %v exited %d", c.env, code)
		}
	}

	// If open read any of these, it would fail (an id it refuses, a
	// timeout of 1ns, a node and labels nothing has, "required" is not a
	// boolean) or print JSON, or reuse one id.
	exported := []string{"SHOAL_NATS=" + url, "SHOAL_ID=Bad_ID!", "SHOAL_JSON=true", "SHOAL_TIMEOUT=1ns",
		"SHOAL_NODE=ghost", "SHOAL_LABELS=gpu=yes", "SHOAL_SANDBOX=required"}
	var ids []string
	for range 2 {
		code, out, errOut := runShoal(t, t.TempDir(), exported, "open", t.TempDir())
		id := strings.TrimSpace(out)
		if code != 0 || strings.Contains(id, "{") || strings.Contains(id, "\n") {
			t.Fatalf("open with exported per-invocation variables: exit %d, stdout %q, stderr %q\nshoal up said:\n%s", code, out, errOut, up.stderrText())
		}
		ids = append(ids, id)
	}
	if ids[0] == ids[1] {
		t.Errorf("two opens gave the same id %s", ids[0])
	}
	// The same flags on the command line do apply.
	code, _, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, "open", "--node", "ghost", t.TempDir())
	if code != exitNotFound || !strings.Contains(errOut, "ghost") {
		t.Errorf("open --node ghost: exit %d, %q; want %d naming ghost", code, errOut, exitNotFound)
	}
}

// A per-invocation flag in the config file is refused, naming it; an
// unknown key gets a suggestion.
func TestSettingsFileHoldsOnlySettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ file, want string }{
		{`id = "fixed"`, `"id" is not a setting: give --id on the command line`},
		{`json = true`, `"json" is not a setting`},
		{`timeout = "1m"`, `"timeout" is not a setting`},
		{`prot = 4222`, `unknown setting "prot"; did you mean port?`},
	} {
		dir := t.TempDir()
		conf := filepath.Join(dir, "config", "shoal", "config.toml")
		os.MkdirAll(filepath.Dir(conf), 0o700)
		os.WriteFile(conf, []byte(c.file+"\n"), 0o600)
		code, _, errOut := runShoal(t, dir, nil, "ls")
		if code != exitUsage || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("config file %q: exit %d, %q; want %d and %q", c.file, code, errOut, exitUsage, c.want)
		}
	}
}

var commentedKey = regexp.MustCompile(`(?m)^# ([a-z][a-z0-9-]*) = `)

// deploy/config.example.toml names every setting and nothing else, all
// commented out, each with a value every command that has the setting
// takes.
func TestSettingsExampleConfig(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "config.example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var active map[string]any
	if _, err := toml.Decode(string(raw), &active); err != nil || len(active) != 0 {
		t.Fatalf("the example sets %v (%v); every key should be commented out", active, err)
	}
	uncommented := commentedKey.ReplaceAllString(string(raw), "$1 = ")
	var values map[string]any
	if _, err := toml.Decode(uncommented, &values); err != nil {
		t.Fatalf("the example, uncommented: %v", err)
	}
	var keys []string
	for k := range values {
		keys = append(keys, k)
	}
	var want []string
	for _, c := range commands() {
		fs, _, _ := c.flagSet()
		for _, name := range c.visibleFlags(fs) {
			if c.isSetting(name) && !slices.Contains(want, name) {
				want = append(want, name)
			}
		}
	}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("the example's keys differ from the settings:\nexample:  %v\nsettings: %v", keys, want)
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(path, []byte(uncommented), 0o600)
	getenv := func(k string) string {
		return map[string]string{"HOME": t.TempDir(), "XDG_CONFIG_HOME": t.TempDir()}[k]
	}
	for _, c := range commands() {
		if c.direct != nil {
			continue
		}
		fs, configPath, _ := c.flagSet()
		l, err := c.parseSettings(fs, []string{"--config", path}, configPath, getenv)
		if err != nil {
			t.Errorf("shoal %s with the example: %v", c.name, err)
			continue
		}
		fs.VisitAll(func(f *flag.Flag) {
			if c.isSetting(f.Name) && !strings.HasPrefix(l.from[f.Name], "config file ") {
				t.Errorf("shoal %s: %s did not come from the example (%q)", c.name, f.Name, l.from[f.Name])
			}
		})
	}
}
