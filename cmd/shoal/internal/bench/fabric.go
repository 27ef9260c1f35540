package bench

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
)

// embedded starts a NATS server with JetStream and the fabric's stream
// and buckets on a free loopback port, its store under dir, as shoal up
// does; the bench's events have no size or age limit there.
func embedded(ctx context.Context, dir string) (*broker.Broker, error) {
	b, err := broker.New(broker.Config{
		Host:     "127.0.0.1",
		Port:     -1,
		StoreDir: filepath.Join(dir, "jetstream"),
		Assets:   broker.Assets{MaxBytes: -1, MaxAge: -1},
	})
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		return nil, fmt.Errorf("start the embedded server: %w", err)
	}
	return b, nil
}

// nodeProc is a `shoal node` process whose claude CLI is the stand-in.
type nodeProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
}

// startNode runs `exe node` against url, under dir, with the claude CLI
// a script that runs `exe __standin` with the turn's shape; with profile
// set, the node writes a CPU profile there.
func startNode(exe, url, dir string, events int, rate float64, profile, name, publish string) (*nodeProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	script := filepath.Join(dir, "claude")
	body := fmt.Sprintf("#!/bin/sh\nexec %s %s --events %d --rate %s -- \"$@\"\n",
		shellQuote(exe), StandinArg, events, strconv.FormatFloat(rate, 'f', -1, 64))
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		return nil, fmt.Errorf("write the stand-in's script: %w", err)
	}
	p := &nodeProc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(exe, "node", "--nats", url, "--claude", script, "--node-name", name,
		"--dir", filepath.Join(dir, "node"), "--log-level", "warn", "--publish", cmp.Or(publish, "batches"))
	p.cmd.Env = append(os.Environ(), "SHOAL_CPUPROFILE="+profile)
	p.cmd.Stdout = &lockedBuffer{p}
	p.cmd.Stderr = &lockedBuffer{p}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the node: %w", err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type lockedBuffer struct{ p *nodeProc }

func (w *lockedBuffer) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.stderr.Write(b)
}

// output is what the node has printed, for an error.
func (p *nodeProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := strings.TrimSpace(p.stderr.String())
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}

// ready waits for the node's record to say it can run claude.
func (p *nodeProc) ready(ctx context.Context, f client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		nodes, err := f.Nodes(ctx)
		if err == nil {
			for _, n := range nodes {
				if n.Name != p.name {
					continue
				}
				for _, b := range n.Backends {
					if b.Kind == "claude" && b.Ready {
						return nil
					}
				}
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("the node exited: %s", p.output())
		case <-ctx.Done():
			return fmt.Errorf("the node %s did not register with a ready claude CLI in a minute: %s", p.name, p.output())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nodeProcs are the run's node processes.
type nodeProcs []*nodeProc

// startNodes starts cfg.Nodes node processes and waits for each to
// register with a ready claude CLI at url; what it started is returned with any
// error, for stop.
func startNodes(ctx context.Context, f client.Client, url string, cfg Config) (nodeProcs, error) {
	var ps nodeProcs
	for i := range cfg.Nodes {
		profile := ""
		if i == 0 {
			profile = cfg.Profile
		}
		p, err := startNode(cfg.Exe, url, filepath.Join(cfg.Dir, fmt.Sprintf("node-%d", i+1)), cfg.Events, cfg.Rate, profile, fmt.Sprintf("bench-%d-%d", os.Getpid(), i+1), cfg.Publish)
		if err != nil {
			return ps, err
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if err := p.ready(ctx, f); err != nil {
			return ps, err
		}
	}
	return ps, nil
}

func (ps nodeProcs) stop() {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// pids names the processes.
func (ps nodeProcs) pids() string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s pid %d", p.name, p.cmd.Process.Pid)
	}
	return b.String()
}

// rss is their resident memory together; 0 where /proc does not say.
func (ps nodeProcs) rss() int64 {
	var n int64
	for _, p := range ps {
		n += p.rss()
	}
	return n
}

// output is what they have printed, for an error.
func (ps nodeProcs) output() string {
	var b strings.Builder
	for _, p := range ps {
		if out := p.output(); out != "" {
			fmt.Fprintf(&b, "[%s] %s\n", p.name, out)
		}
	}
	return strings.TrimSpace(b.String())
}

// stop ends the node with SIGTERM, and kills it if it lingers.
func (p *nodeProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// rss is the node process's resident memory in bytes (VmRSS), or 0 where
// /proc does not say.
func (p *nodeProc) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
