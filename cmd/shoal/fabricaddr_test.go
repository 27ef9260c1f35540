package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/internal/freeport"
)

// freePort is a loopback port nothing listens on a moment ago.
func freePort(t *testing.T) int { return freeport.Take(t) }

// One config file that names where the fabric is, by its port or by its
// URL, serves shoal up and its clients alike: shoal up listens there, and
// shoal ls, shoal mcp and the TUI dial there, with no flag and no
// environment naming it. SHOAL_NATS exported where shoal up starts is
// where it listens too, not an external server; only --nats on shoal up's
// command line names one, and its error says so. Where the port and the
// URL come from different places, the one that wins (the command line,
// then the environment, then the file) serves both sides.
func TestOneSettingServesUpAndItsClients(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"port", "url", "env", "file port, env url", "file url, env port"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			port := strconv.Itoa(freePort(t))
			conf := "no-node = true\nno-bus = true\nmcp-listen = \"127.0.0.1:0\"\n"
			var env []string
			switch how {
			case "port":
				conf += "port = " + port + "\n"
			case "url":
				conf += "nats = \"nats://127.0.0.1:" + port + "\"\n"
			case "env":
				env = []string{"SHOAL_NATS=nats://127.0.0.1:" + port}
			case "file port, env url":
				// The environment beats the file, for shoal up and its
				// clients alike (before, up took the file's port and the
				// clients the environment's URL).
				conf += "port = " + strconv.Itoa(freePort(t)) + "\n"
				env = []string{"SHOAL_NATS=nats://127.0.0.1:" + port}
			case "file url, env port":
				conf += "nats = \"nats://127.0.0.1:" + strconv.Itoa(freePort(t)) + "\"\n"
				env = []string{"SHOAL_PORT=" + port}
			}
			os.MkdirAll(filepath.Join(dir, "config", "shoal"), 0o755)
			if err := os.WriteFile(filepath.Join(dir, "config", "shoal", "config.toml"), []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			up := startShoal(t, dir, env, "up")
			if got := up.waitLine("shoal: NATS listening on "); got != "shoal: NATS listening on nats://127.0.0.1:"+port {
				t.Fatalf("shoal up: %q, want it on port %s", got, port)
			}
			up.waitLine("shoal: ready")
			if code, out, errOut := runShoal(t, dir, env, "ls"); code != 0 || !strings.Contains(out, "No agents") {
				t.Errorf("shoal ls: exit %d: %s%s", code, out, errOut)
			}
			cmd := exec.Command(os.Args[0], "mcp")
			cmd.Env = append(baseEnv(dir), env...)
			s, err := mcp.NewClient(&mcp.Implementation{Name: "addr-test", Version: "1"}, nil).Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatalf("shoal mcp: %v", err)
			}
			res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_nodes"})
			if err != nil || res.IsError {
				t.Errorf("shoal mcp's agent_nodes: %+v %v", res, err)
			}
			s.Close()
			scr := startTUI(t, append(baseEnv(dir), env...))
			scr.waitText("0 agents")
		})
	}
	code, _, errOut := runShoal(t, t.TempDir(), nil, "up", "--no-node", "--nats", "nats://127.0.0.1:1")
	if code == 0 || !strings.Contains(errOut, "shoal up --nats on the command line names a NATS deployment to use instead of the embedded server") {
		t.Errorf("shoal up --nats at nothing: exit %d: %q", code, errOut)
	}
}
