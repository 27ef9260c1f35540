package tui

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/shoalfabric/shoal/schemas"
)

// streamingFabric is a fabric of n agents, each streaming a turn after
// turn: text chunks, a tool call and its result, the turn's end.
type streamingFabric struct {
	noActions
	n    int
	rate int // events per second, over all agents
}

func (f streamingFabric) Agents(context.Context) ([]schemas.AgentRecord, error) {
	out := make([]schemas.AgentRecord, f.n)
	for i := range out {
		out[i] = schemas.AgentRecord{ID: fmt.Sprintf("a%03d", i), Node: fmt.Sprintf("node%d", i%4), Status: schemas.StatusWorking, Model: "sonnet", CWD: "/work", Turn: 1}
	}
	return out, nil
}

func (f streamingFabric) Nodes(context.Context) ([]schemas.NodeRecord, error) {
	return []schemas.NodeRecord{{Name: "node0"}, {Name: "node1"}, {Name: "node2"}, {Name: "node3"}}, nil
}

func (f streamingFabric) History(context.Context, string, int) ([]Event, error) {
	return nil, nil
}

// event is agent i's k-th event of a repeating turn.
func (f streamingFabric) event(k int) schemas.Event {
	completed := schemas.ToolCompleted
	switch k % 40 {
	case 0:
		return schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}}
	case 10:
		return schemas.Event{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: fmt.Sprint("t", k/40), Title: "Bash", Kind: schemas.ToolExecute, Status: schemas.ToolPending, RawInput: []byte(`{"command":"go test ./..."}`)}}}
	case 11:
		return schemas.Event{Turn: 1, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: fmt.Sprint("t", k/40), Status: &completed, Content: []schemas.ToolCallContent{schemas.ToolText("ok")}}}}
	case 38:
		return schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("All the tests pass.")}}
	case 39:
		return schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{InputTokens: 100, OutputTokens: 20}}}
	}
	return schemas.Event{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("a few streamed words ")}}
}

// Follow sends the agents' events round robin, at f.rate a second.
func (f streamingFabric) Follow(ctx context.Context, _ Resume, fn func(Event)) error {
	const tick = 10 * time.Millisecond
	per := max(1, f.rate/int(time.Second/tick))
	t := time.NewTicker(tick)
	defer t.Stop()
	for k := 0; ; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		for range per {
			fn(Event{Agent: fmt.Sprintf("a%03d", k%f.n), N: uint64(k/f.n + 1), Event: f.event(k / f.n)})
			k++
		}
	}
}

// cpu is the process's CPU time so far.
func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPerSecond runs work for d and returns the CPU time it took per
// second of wall time.
func cpuPerSecond(d time.Duration, work func(ctx context.Context)) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start, wall := cpu(), time.Now()
	work(ctx)
	return (cpu() - start).Seconds() / time.Since(wall).Seconds()
}

// BenchmarkTUIWith200Agents measures the monitor with 200 agents
// streaming 10,000 events a second in all: the CPU the whole program
// (reading, updating, rendering at the renderer's frame rate) takes per
// second, against the same event stream consumed by nothing in the same
// run, and the time of one frame (View) of a full screen.
func BenchmarkTUIWith200Agents(b *testing.B) {
	src := streamingFabric{n: 200, rate: 10000}
	const run = 3 * time.Second

	baseline := cpuPerSecond(run, func(ctx context.Context) {
		src.Follow(ctx, Resume{}, func(Event) {})
	})
	var model *Model
	withTUI := cpuPerSecond(run, func(ctx context.Context) {
		model = New(ctx, src, Options{Poll: time.Second})
		p := tea.NewProgram(model, tea.WithContext(ctx), tea.WithInput(nil), tea.WithOutput(io.Discard), tea.WithoutSignalHandler(),
			tea.WithWindowSize(160, 48))
		p.Run()
	})
	if model.width != 160 {
		b.Fatalf("the monitor is %d columns wide, want 160", model.width)
	}
	if len(model.agents) != 200 {
		b.Fatalf("the monitor shows %d agents", len(model.agents))
	}
	events := 0
	for _, f := range model.feeds {
		events += len(f.lines)
	}
	if events == 0 {
		b.Fatal("no event reached the monitor")
	}

	b.ResetTimer()
	for range b.N {
		model.View()
	}
	b.StopTimer()
	b.ReportMetric(withTUI, "tui-cpu-s/s")
	b.ReportMetric(baseline, "source-cpu-s/s")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/frame")
}
