package node_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// BenchmarkSandboxedVsPlain opens a real claude agent against the fake
// model server, runs one turn that calls one Bash tool, and closes it,
// sandboxed and not, alternating in the same run: the open's time (the
// node's claim, the wrapper's Landlock and seccomp set-up, the proxy, the
// CLI's start) and the turn's (the CLI's model traffic through the proxy,
// the tool's shell under the sandbox).
func BenchmarkSandboxedVsPlain(b *testing.B) {
	argv := peers.Claude.Command(b)
	fake := fakemodel.Start(b, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		if len(r.ToolResults) > 0 {
			return fakemodel.Reply{Text: "done"}
		}
		return bash("ls -la")
	}})
	srv := natstest.Start(b)
	cfg := node.Config{Name: "bench", Conn: natstest.Connect(b, srv), Dir: b.TempDir(), Reaper: os.Args[0],
		Backends: []backend.Backend{claude.New(claude.Config{Path: argv[0], Env: peers.ClaudeEnv(b.TempDir(), fake.URL()), StopWait: time.Second})}}
	h, err := node.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	<-h.Ready()
	fabric, err := client.NewDirect(natstest.Connect(b, srv), client.Config{})
	if err != nil {
		b.Fatal(err)
	}
	var open, turn [2]time.Duration
	for i := 0; b.Loop(); i++ {
		for s, sandboxed := range []bool{false, true} {
			t0 := time.Now()
			op, err := fabric.Open(ctx, schemas.OpenRequest{CWD: b.TempDir(), Permission: "bypass", Sandbox: &sandboxed})
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			rep, err := fabric.Run(ctx, schemas.RunRequest{AgentID: op.AgentID, Text: fmt.Sprintf("turn %d", i)})
			if err != nil || rep.Text != "done" {
				b.Fatalf("the turn (sandboxed %v): %+v %v", sandboxed, rep, err)
			}
			open[s] += t1.Sub(t0)
			turn[s] += time.Since(t1)
			if _, err := fabric.Close(ctx, schemas.AgentRequest{AgentID: op.AgentID}); err != nil {
				b.Fatal(err)
			}
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(open[0]), "plain-open-ms")
	b.ReportMetric(ms(open[1]), "sandboxed-open-ms")
	b.ReportMetric(float64(open[1])/float64(open[0]), "open-ratio")
	b.ReportMetric(ms(turn[0]), "plain-turn-ms")
	b.ReportMetric(ms(turn[1]), "sandboxed-turn-ms")
	b.ReportMetric(float64(turn[1])/float64(turn[0]), "turn-ratio")
}
