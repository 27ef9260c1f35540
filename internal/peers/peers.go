// Package peers installs and locates the real agent CLIs Shoal's tests run
// against, at pinned versions, and builds the environment each needs to
// stay offline: a private HOME and a model server on 127.0.0.1.
//
// The README's test command installs them (go run ./internal/peers/install)
// into a cache folder; tests only look them up, and fail with a message that
// says how to install them when they are missing. A CLI found on PATH is
// never used.
package peers

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Peer is a program published on npm that the tests run: an agent CLI,
// or the sandbox the escape battery holds Shoal's against.
type Peer struct {
	Name    string // short name: claude, claude-agent-acp, opencode, gemini, srt, node22, mcp-conformance
	Package string // npm package
	Version string // pinned version
	// argv returns the command that runs the CLI, given its install dir.
	argv func(dir string) ([]string, error)
}

// The pinned peers: the agent CLIs the tests run, each at the version the
// test command installs.
var (
	Claude = Peer{Name: "claude", Package: "@anthropic-ai/claude-code", Version: "2.1.197",
		argv: nativeBinary("node_modules/@anthropic-ai/claude-code-%s/claude")}
	ClaudeACP = Peer{Name: "claude-agent-acp", Package: "@zed-industries/claude-agent-acp", Version: "0.23.1",
		argv: nodeScript("node_modules/@zed-industries/claude-agent-acp/dist/index.js")}
	Opencode = Peer{Name: "opencode", Package: "opencode-ai", Version: "1.18.33",
		argv: nativeBinary("node_modules/opencode-%s/bin/opencode")}
	Gemini = Peer{Name: "gemini", Package: "@google/gemini-cli", Version: "0.61.0",
		argv: nodeScript("node_modules/@google/gemini-cli/bundle/gemini.js")}
	// SandboxRuntime is srt, a bubblewrap sandbox (it needs Debian's
	// bubblewrap, socat and ripgrep): the escape battery runs under it
	// beside Shoal's own sandbox.
	SandboxRuntime = Peer{Name: "srt", Package: "@anthropic-ai/sandbox-runtime", Version: "0.0.83",
		argv: nodeScript("node_modules/@anthropic-ai/sandbox-runtime/dist/cli.js")}

	// Node22 is a Node.js 22, from npm, for what Node 20 cannot run.
	Node22 = Peer{Name: "node22", Package: "node", Version: "22.23.3",
		argv: func(dir string) ([]string, error) {
			path := filepath.Join(dir, "node_modules", "node", "bin", "node")
			if err := executable(path); err != nil {
				return nil, err
			}
			return []string{path}, nil
		}}
	// Conformance is the MCP conformance suite, which the MCP endpoint is
	// held to; it needs Node 22 (Node22, installed before it).
	Conformance = Peer{Name: "mcp-conformance", Package: "@modelcontextprotocol/conformance", Version: "0.1.16",
		argv: func(dir string) ([]string, error) {
			script := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
			if _, err := os.Stat(script); err != nil {
				return nil, fmt.Errorf("its entry point is missing: %w", err)
			}
			node, err := Node22.argv(Node22.InstallDir(filepath.Dir(dir)))
			if err != nil {
				return nil, fmt.Errorf("it needs %s: %w", Node22.Spec(), err)
			}
			return []string{node[0], script}, nil
		}}
)

// All lists every pinned peer, each after what it needs.
var All = []Peer{Claude, ClaudeACP, Opencode, Gemini, SandboxRuntime, Node22, Conformance}

// Dir is the cache folder peers are installed in: $SHOAL_PEERS_DIR, else
// $XDG_CACHE_HOME/shoal-peers, else ~/.cache/shoal-peers.
func Dir() string {
	if d := os.Getenv("SHOAL_PEERS_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "shoal-peers")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "shoal-peers")
}

// InstallDir is where one version of the peer lives under root.
func (p Peer) InstallDir(root string) string {
	return filepath.Join(root, p.Name+"@"+p.Version)
}

// Spec is the npm install spec, package@version.
func (p Peer) Spec() string { return p.Package + "@" + p.Version }

const marker = ".shoal-installed"

// Installed reports whether the peer is installed under root and runnable.
func (p Peer) Installed(root string) bool {
	dir := p.InstallDir(root)
	b, err := os.ReadFile(filepath.Join(dir, marker))
	if err != nil || strings.TrimSpace(string(b)) != p.Spec() {
		return false
	}
	_, err = p.argv(dir)
	return err == nil
}

// Install puts the peer under root with npm, unless it is already there.
// It reports whether it installed anything.
func (p Peer) Install(ctx context.Context, root string) (bool, error) {
	if p.Installed(root) {
		return false, nil
	}
	dir := p.InstallDir(root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--save-exact",
		"--loglevel=error", "--prefix", dir, p.Spec())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("npm install %s: %w\n%s", p.Spec(), err, out)
	}
	if _, err := p.argv(dir); err != nil {
		return false, fmt.Errorf("npm installed %s but %w", p.Spec(), err)
	}
	return true, os.WriteFile(filepath.Join(dir, marker), []byte(p.Spec()+"\n"), 0o644)
}

// Command returns the argv that runs the installed peer, or fails the test
// with the command that installs it.
func (p Peer) Command(tb testing.TB) []string {
	tb.Helper()
	root := Dir()
	if !p.Installed(root) {
		tb.Fatalf("%s is not installed in %s; the test command installs it (scripts/test), or run: go run ./internal/peers/install", p.Spec(), root)
	}
	argv, err := p.argv(p.InstallDir(root))
	if err != nil {
		tb.Fatalf("%s: %v", p.Spec(), err)
	}
	return argv
}

// platform is npm's name for this machine in platform package names.
func platform() string {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if arch == "" {
		arch = runtime.GOARCH
	}
	return runtime.GOOS + "-" + arch
}

// nativeBinary finds a CLI shipped as a per-platform npm package, calling
// the binary directly so that npm's install scripts do not matter.
func nativeBinary(pattern string) func(string) ([]string, error) {
	return func(dir string) ([]string, error) {
		path := filepath.Join(dir, fmt.Sprintf(pattern, platform()))
		if err := executable(path); err != nil {
			return nil, err
		}
		return []string{path}, nil
	}
}

// nodeScript runs a CLI that is a Node.js script, with the node on PATH.
func nodeScript(rel string) func(string) ([]string, error) {
	return func(dir string) ([]string, error) {
		path := filepath.Join(dir, rel)
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("its entry point is missing: %w", err)
		}
		node, err := exec.LookPath("node")
		if err != nil {
			return nil, fmt.Errorf("node is not on PATH: %w", err)
		}
		return []string{node, path}, nil
	}
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("its binary is missing: %w", err)
	}
	if fi.Mode()&0o111 == 0 {
		return fmt.Errorf("its binary %s is not executable", path)
	}
	return nil
}
