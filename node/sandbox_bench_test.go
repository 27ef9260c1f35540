package node_test

import (
	"context"
	"fmt"
	"os"
	"slices"
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
//
// Each round runs the three ways back to back (each round starting with
// the next way, so none always follows the same one's close), and so
// gives a sandboxed turn's ratio to the plain turn beside it; the ratio
// reported is the median of the rounds'. On two cores a turn's time drifts by more
// than the sandbox costs (the same plain turn varies by a tenth from one
// round to the next), and a round's pair shares its drift; the mean
// milliseconds of each way are reported beside it.
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
	openRatio, turnRatio := make([][]float64, len(ways)), make([][]float64, len(ways))
	for i := 0; b.Loop(); i++ {
		var openTook, turnTook [3]time.Duration
		for k := range ways {
			// Each round starts with the next way: none always follows
			// the same one's close.
			w := (i + k) % len(ways)
			way := ways[w]
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
			openTook[w], turnTook[w] = t1.Sub(t0), time.Since(t1)
			open[w] += openTook[w]
			turn[w] += turnTook[w]
			if _, err := fabric.Close(ctx, schemas.AgentRequest{AgentID: op.AgentID}); err != nil {
				b.Fatal(err)
			}
		}
		for w := 1; w < len(ways); w++ {
			openRatio[w] = append(openRatio[w], float64(openTook[w])/float64(openTook[0]))
			turnRatio[w] = append(turnRatio[w], float64(turnTook[w])/float64(turnTook[0]))
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	for w, way := range ways {
		b.ReportMetric(ms(open[w]), way.name+"-open-ms")
		b.ReportMetric(ms(turn[w]), way.name+"-turn-ms")
		if w > 0 {
			b.ReportMetric(median(openRatio[w]), way.name+"-open-ratio")
			b.ReportMetric(median(turnRatio[w]), way.name+"-turn-ratio")
		}
	}
}

// median is the middle of xs (the mean of the middle two when even).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
