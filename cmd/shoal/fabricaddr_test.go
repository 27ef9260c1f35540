package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// A port and a nats given in one place (one config file, or SHOAL_PORT and
// SHOAL_NATS both) would have shoal up listen on the one and its clients
// dial the other: every command that reads them refuses them, naming both
// and the place, unless they name the same port. Naming the same port,
// shoal up listens there and its clients dial it.
func TestPortAndNatsInOnePlace(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(freePort(t))
	other := strconv.Itoa(freePort(t))
	for _, how := range []string{"file", "env"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			conf := filepath.Join(dir, "shoal.toml")
			if err := os.WriteFile(conf, []byte("port = "+port+"\nnats = \"nats://127.0.0.1:"+other+"\"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			env, want := []string{"SHOAL_CONFIG=" + conf}, "config file "+conf+": port = "+port+" and nats = \"nats://127.0.0.1:"+other+"\" name different ports"
			if how == "env" {
				env, want = []string{"SHOAL_PORT=" + port, "SHOAL_NATS=nats://127.0.0.1:" + other}, "environment SHOAL_PORT="+port+" and SHOAL_NATS=\"nats://127.0.0.1:"+other+"\" name different ports"
			}
			for _, args := range [][]string{{"up", "--no-node", "--no-mcp", "--no-bus"}, {"ls"}, {"node"}, {"config", "up"}} {
				// shoal up that took the settings would serve until
				// stopped: the context ends it.
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				cmd := exec.CommandContext(ctx, os.Args[0], args...)
				cmd.Env = append(baseEnv(dir), env...)
				var errOut strings.Builder
				cmd.Stderr = &errOut
				cmd.Run()
				cancel()
				if code := cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(errOut.String(), want) {
					t.Errorf("shoal %v: exit %d, %q; want exit %d and %q", args, code, errOut.String(), exitUsage, want)
				}
			}
		})
	}
	t.Run("same port", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		port := strconv.Itoa(freePort(t))
		conf := filepath.Join(dir, "shoal.toml")
		if err := os.WriteFile(conf, []byte("port = "+port+"\nnats = \"nats://localhost:"+port+"\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		env := []string{"SHOAL_CONFIG=" + conf}
		up := startShoal(t, dir, env, "up", "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0")
		if got := up.waitLine("shoal: NATS listening on "); got != "shoal: NATS listening on nats://127.0.0.1:"+port {
			t.Fatalf("shoal up: %q, want it on port %s", got, port)
		}
		up.waitLine("shoal: ready")
		if code, out, errOut := runShoal(t, dir, env, "ls"); code != 0 || !strings.Contains(out, "No agents") {
			t.Errorf("shoal ls: exit %d: %s%s", code, out, errOut)
		}
	})
}
