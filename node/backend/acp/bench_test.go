package acp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// agentStdout is what an ACP agent printed in a recorded transcript: its
// messages to the client, one per line.
func agentStdout(tb testing.TB, path string) []byte {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			Dir string          `json:"dir"`
			Msg json.RawMessage `json:"msg"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			tb.Fatal(err)
		}
		if rec.Dir == "agent->client" {
			out.Write(rec.Msg)
			out.WriteByte('\n')
		}
	}
	return out.Bytes()
}

// BenchmarkACPVsClaudePath measures, in one run, the per-event cost of
// the ACP path (the wire reading the agent's stdout, the update mapper,
// envelope encoding) against the claude path (the stream-json decoder,
// envelope encoding) on recorded transcripts of the same kind of session,
// each repeated 20 times. It reports both costs and their ratio
// (ACP/claude).
func BenchmarkACPVsClaudePath(b *testing.B) {
	acpOut := bytes.Repeat(agentStdout(b, "testdata/golden-acp-claude.jsonl"), 20)
	claudeOut, err := os.ReadFile("../../testdata/claude-stream-json.jsonl")
	if err != nil {
		b.Fatal(err)
	}
	claudeOut = bytes.Repeat(claudeOut, 20)

	acpRun := func() int {
		n := 0
		m := newMapper()
		pr, pw := io.Pipe()
		go io.Copy(io.Discard, pr) // what the JSON-RPC connection would read
		w := &wire{in: bytes.NewReader(acpOut), out: pw, maxLine: 64 << 20,
			update: func(_ string, raw json.RawMessage) {
				for _, p := range m.update(raw) {
					if _, err := schemas.Encode(schemas.Event{Turn: 1, Payload: p}); err != nil {
						b.Fatal(err)
					}
					n++
				}
			},
			permission: func(_, _ json.RawMessage) { n++ },
			garbage:    func([]byte, int) { b.Fatal("garbage in a recorded transcript") },
		}
		w.run()
		return n
	}
	claudeRun := func() int {
		n := 0
		var d claude.Decoder
		sc := bufio.NewScanner(bytes.NewReader(claudeOut))
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			for _, p := range d.Line(sc.Bytes(), false) {
				if _, err := schemas.Encode(schemas.Event{Turn: 1, Payload: p}); err != nil {
					b.Fatal(err)
				}
				n++
			}
		}
		return n
	}
	acpRun() // warm up
	claudeRun()

	var acpTime, claudeTime time.Duration
	acpEvents, claudeEvents := 0, 0
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		acpEvents += acpRun()
		acpTime += time.Since(start)
		start = time.Now()
		claudeEvents += claudeRun()
		claudeTime += time.Since(start)
	}
	b.StopTimer()
	acpCost := float64(acpTime.Nanoseconds()) / float64(acpEvents)
	claudeCost := float64(claudeTime.Nanoseconds()) / float64(claudeEvents)
	b.ReportMetric(acpCost, "acp-ns/event")
	b.ReportMetric(claudeCost, "claude-ns/event")
	b.ReportMetric(acpCost/claudeCost, "ratio")
}
