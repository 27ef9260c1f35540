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
// three ways alternating in the same run: plain, sandboxed in namespaces
// of its own (a node's default), and sandboxed with Landlock and seccomp
// alone (a node whose sandbox kind is landlock). The open's time is the
// node's claim, the wrapper's set-up, the proxy and the CLI's start; the
// turn's, the CLI's model traffic through the proxy and the tool's shell
// under the sandbox.
func BenchmarkSandboxedVsPlain(b *testing.B) {
	argv := peers.Claude.Command(b)
	fake := fakemodel.Start(b, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		if len(r.ToolResults) > 0 {
			return fakemodel.Reply{Text: "done"}
		}
		return bash("ls -la")
	}})
	srv := natstest.Start(b)
	for _, n := range []struct{ name, kind string }{{"bench", schemas.SandboxNamespaces}, {"bench-landlock", schemas.SandboxLandlock}} {
		cfg := node.Config{Name: n.name, Conn: natstest.Connect(b, srv), Dir: b.TempDir(), Reaper: os.Args[0], SandboxKind: n.kind,
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
	}
	ctx := b.Context()
	fabric, err := client.NewDirect(natstest.Connect(b, srv), client.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ways := []struct {
		name    string
		node    string
		sandbox bool
	}{{"plain", "bench", false}, {"namespaces", "bench", true}, {"landlock", "bench-landlock", true}}
	open, turn := make([]time.Duration, len(ways)), make([]time.Duration, len(ways))
	for i := 0; b.Loop(); i++ {
		for w, way := range ways {
			t0 := time.Now()
			op, err := fabric.Open(ctx, schemas.OpenRequest{CWD: b.TempDir(), Permission: "bypass", Sandbox: &way.sandbox, Node: way.node})
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			rep, err := fabric.Run(ctx, schemas.RunRequest{AgentID: op.AgentID, Text: fmt.Sprintf("turn %d", i)})
			if err != nil || rep.Text != "done" {
				b.Fatalf("the turn (%s): %+v %v", way.name, rep, err)
			}
			open[w] += t1.Sub(t0)
			turn[w] += time.Since(t1)
			if _, err := fabric.Close(ctx, schemas.AgentRequest{AgentID: op.AgentID}); err != nil {
				b.Fatal(err)
			}
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	for w, way := range ways {
		b.ReportMetric(ms(open[w]), way.name+"-open-ms")
		b.ReportMetric(ms(turn[w]), way.name+"-turn-ms")
		if w > 0 {
			b.ReportMetric(float64(open[w])/float64(open[0]), way.name+"-open-ratio")
			b.ReportMetric(float64(turn[w])/float64(turn[0]), way.name+"-turn-ratio")
		}
	}
}
