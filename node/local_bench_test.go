package node_test

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/local"
	"github.com/shoalfabric/shoal/schemas"
)

// BenchmarkOllamaTokensVsRawStream streams the same 2,000-chunk answer
// from the fake Ollama server in one run two ways: read raw off
// /api/chat, and through a node (the Ollama backend, envelopes, the
// ordered JetStream publisher) to an observer of agent.<id>. It reports
// both rates in streamed chunks (tokens) per second and their ratio
// (node/raw).
func BenchmarkOllamaTokensVsRawStream(b *testing.B) {
	const chunks = 2000
	reply := fakemodel.Reply{Text: strings.Repeat("tok ", chunks), ChunkSize: 4}
	fake := fakemodel.Start(b, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return reply }})

	raw := func() int {
		body := `{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"go"}]}`
		resp, err := http.Post(fake.URL()+"/api/chat", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		n := 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), []byte(`"content":"tok`)) {
				n++
			}
		}
		return n
	}

	be, err := local.New(local.Config{Kind: backend.BackendOllama, Host: fake.URL()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, h, rep, _, msgs := watchedAgent(b, natstest.Start(b), be, "ollama:fake-model")
	viaNode := func() int {
		if _, err := h.Send(ctx, schemas.SendRequest{AgentID: rep.AgentID, Text: "go"}); err != nil {
			b.Fatal(err)
		}
		n := 0
		timeout := time.After(time.Minute)
		for {
			select {
			case m := <-msgs:
				switch {
				case bytes.HasPrefix(m.Data, []byte(`{"kind":"assistant_text","turn":`)) && bytes.Contains(m.Data, []byte(`"delta":true`)):
					n++
				case bytes.HasPrefix(m.Data, []byte(`{"kind":"result"`)):
					return n
				}
			case <-timeout:
				b.Fatalf("no result after %d chunks", n)
			}
		}
	}
	if got, want := viaNode(), raw(); got != want || got < chunks/2 {
		b.Fatalf("the node streamed %d chunks, the server %d", got, want)
	}

	var rawTime, nodeTime time.Duration
	tokens := 0
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		n := raw()
		rawTime += time.Since(start)
		start = time.Now()
		viaNode()
		nodeTime += time.Since(start)
		tokens += n
	}
	b.StopTimer()
	rawRate := float64(tokens) / rawTime.Seconds()
	nodeRate := float64(tokens) / nodeTime.Seconds()
	b.ReportMetric(rawRate, "raw-tokens/s")
	b.ReportMetric(nodeRate, "node-tokens/s")
	b.ReportMetric(nodeRate/rawRate, "ratio")
}
