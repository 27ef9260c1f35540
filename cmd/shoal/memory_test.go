package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// upMemoryBound is the resident memory a default `shoal up` stays under
// through a sustained firehose (README, docs/performance.md).
const upMemoryBound = 768 << 20

// A firehose of 2,000,000 events (20 agents' text deltas, published as
// fast as JetStream takes them) through a `shoal up` with its defaults
// (the Kaimon bus and the MCP endpoint on): its resident memory, sampled
// throughout, stays under the documented bound. Under the race detector
// (ten times slower) it is a tenth of the firehose; scripts/test runs the
// whole one in a step of its own, without it.
func TestDefaultUpBoundsItsMemory(t *testing.T) {
	t.Parallel()
	each := 100_000
	if raceEnabled {
		each /= 10
		t.Logf("under the race detector: %d events, not 2,000,000 (the full firehose runs without it)", 20*each)
	}
	up := startShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--no-node", "--mcp-listen", "127.0.0.1:0")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		t.Fatal(err)
	}
	var peak int64
	var mu sync.Mutex
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss := residentBytes(up.cmd.Process.Pid); rss > 0 {
				mu.Lock()
				peak = max(peak, rss)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	const agents = 20
	start := time.Now()
	var wg sync.WaitGroup
	for a := range agents {
		wg.Go(func() {
			id := fmt.Sprintf("fire%02d", a)
			for n := uint64(1); n <= uint64(each); n++ {
				env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("chunk " + strconv.FormatUint(n, 10) + " ")}})
				m := nats.NewMsg(schemas.EventSubject(id))
				m.Data = env
				m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, n))
				m.Header.Set(schemas.HeaderNode, "hose")
				if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		t.Fatal("the firehose's publishes were not all acknowledged")
	}
	close(stop)
	<-sampled
	t.Logf("%d events in %s; peak resident memory %d MiB", agents*each, time.Since(start).Round(time.Second), peak>>20)
	if peak == 0 {
		t.Fatal("the coordinator's resident memory could not be read")
	}
	if peak > upMemoryBound {
		t.Errorf("a default shoal up peaked at %d MiB through the firehose; the documented bound is %d MiB", peak>>20, upMemoryBound>>20)
	}
}

// residentBytes is a process's VmRSS, 0 when it cannot be read.
func residentBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
