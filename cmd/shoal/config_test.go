package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// shoal config prints each setting's value and where it came from: the
// default, the config file, the environment (an old name too), a flag.
// Tokens are hidden; per-invocation flags are not settings and not shown.
func TestConfigShowsWhereEachValueCameFrom(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config", "shoal", "config.toml")
	os.MkdirAll(filepath.Dir(conf), 0o700)
	os.WriteFile(conf, []byte("port = 4333\nnode-ttl = \"5s\"\nmcp-token = \"sekrit\"\nlabels = \"site=lab\"\n"), 0o600)
	env := []string{"SHOAL_NODE_TTL=9s", "SHOAL_NODE_NAME=envnode", "SHOAL_ID=not-a-setting"}
	code, out, errOut := runShoal(t, dir, env, "config", "up", "--host", "127.0.0.9")
	if code != 0 {
		t.Fatalf("shoal config up: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"# config file " + conf + " (read; from the default place)",
		`host = "127.0.0.9"  # flag --host`,
		"port = 4333 # config file " + conf,
		`node-ttl = "9s" # env SHOAL_NODE_TTL`,
		`node-name = "envnode" # env SHOAL_NODE_NAME`,
		`labels = "site=lab" # config file ` + conf,
		`mcp-token = "<hidden>" # config file ` + conf,
		`store = "" # default: $XDG_DATA_HOME/shoal/jetstream`,
		`max-payload = "8MiB" # default`,
	} {
		if !strings.Contains(squeeze(out), squeeze(want)) {
			t.Errorf("shoal config up lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "sekrit") || strings.Contains(out, "not-a-setting") {
		t.Errorf("shoal config up shows a token or a per-invocation value:\n%s", out)
	}
	// What it prints is TOML a config file can take, every key a setting.
	var values map[string]any
	if _, err := toml.Decode(out, &values); err != nil {
		t.Fatalf("shoal config up is not TOML: %v\n%s", err, out)
	}
	if values["port"] != int64(4333) || values["auth"] != false || values["node-ttl"] != "9s" {
		t.Errorf("decoded %v", values)
	}

	// An old spelling, and the client commands together.
	code, out, _ = runShoal(t, dir, []string{"SHOAL_NAME=oldname", "SHOAL_NATS=nats://127.0.0.1:4999"}, "config")
	if code != 0 {
		t.Fatalf("shoal config: exit %d", code)
	}
	for _, want := range []string{
		"# shoal up\n", "# shoal node\n", "# shoal creds\n",
		"# shoal open, send, run, output, status, diff, fetch, job, ls, nodes, interrupt, set-model, close, permit, pending, tail, watch, usage, budget, tui, mcp, completion\n",
		`node-name = "oldname" # env SHOAL_NAME`,
		`nats = "nats://127.0.0.1:4999" # env SHOAL_NATS`,
	} {
		if !strings.Contains(squeeze(out), squeeze(want)) {
			t.Errorf("shoal config lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"\nid =", "\njson =", "\ntimeout =", "\nfrom ="} {
		if strings.Contains(out, bad) {
			t.Errorf("shoal config lists a per-invocation flag %q:\n%s", bad, out)
		}
	}
	if code, _, errOut := runShoal(t, dir, nil, "config", "opne"); code != exitUsage || !strings.Contains(errOut, "did you mean open?") {
		t.Errorf("shoal config opne: exit %d, %q", code, errOut)
	}
}

var spaces = regexp.MustCompile(` +`)

// squeeze collapses runs of spaces, the alignment of shoal config's
// columns.
func squeeze(s string) string { return spaces.ReplaceAllString(s, " ") }
