package web_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// storedDash stores m events of agent id (a recorded turn, repeated) and
// serves the dashboard over them, with no token, on loopback.
func storedDash(tb testing.TB, id string, m int) (url string, js jetstream.JetStream) {
	tb.Helper()
	srv := natstest.Start(tb)
	_, js = natstest.JetStream(tb, srv)
	envs := fabrictest.TurnEnvelopes(tb)
	for i := range m {
		msg := nats.NewMsg(schemas.EventSubject(id))
		msg.Data = envs[i%len(envs)]
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, uint64(i+1)))
		if _, err := js.PublishMsgAsync(msg); err != nil {
			tb.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	f, err := client.NewDirect(natstest.Connect(tb, srv), client.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	hs := httptest.NewServer(web.New(web.Config{Client: f}))
	tb.Cleanup(hs.Close)
	return hs.URL, js
}

// readSSE reads an event stream to its "end" event, returning the ids.
func readSSE(tb testing.TB, url, lastEventID string) []uint64 {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != http.StatusOK || ct != "text/event-stream" {
		tb.Fatalf("GET %s: %d %s", url, res.StatusCode, ct)
	}
	var ids []uint64
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if id, ok := strings.CutPrefix(line, "id: "); ok {
			n, err := strconv.ParseUint(id, 10, 64)
			if err != nil {
				tb.Fatalf("id %q", id)
			}
			ids = append(ids, n)
		}
		if line == "event: end" || line == "event: failure" {
			return ids
		}
	}
	tb.Fatalf("the stream ended without an end event: %v", sc.Err())
	return nil
}

func span(from, to uint64) []uint64 {
	var s []uint64
	for n := from; n <= to; n++ {
		s = append(s, n)
	}
	return s
}

// A stream's SSE ids are the event numbers; Last-Event-ID resumes at the
// next event, ?event= starts at one, ?time= at a time.
func TestEventStreamResumes(t *testing.T) {
	t.Parallel()
	url, _ := storedDash(t, "resume", 50)
	base := url + "/api/agents/resume/events?follow=0"
	if got := readSSE(t, base, ""); !slices.Equal(got, span(1, 50)) {
		t.Errorf("from the start: %v", got)
	}
	if got := readSSE(t, base, "20"); !slices.Equal(got, span(21, 50)) {
		t.Errorf("after Last-Event-ID 20: %v", got)
	}
	// The largest number once wrapped to 0: the stream started over.
	for _, bad := range []string{"18446744073709551615", "-1", "x"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base, nil)
		req.Header.Set("Last-Event-ID", bad)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "is not an event number") {
			t.Errorf("Last-Event-ID %s: %d %s, want 400 naming it", bad, res.StatusCode, body)
		}
	}
	if got := readSSE(t, base+"&event=10", ""); !slices.Equal(got, span(10, 50)) {
		t.Errorf("from event 10: %v", got)
	}
	// A time past what a time holds (it wrapped, and the stream started
	// over), and two places to start at, are refused.
	for _, bad := range []string{"&time=9300000000", "&time=1e300", "&time=NaN", "&time=Inf", "&time=-5", "&event=5&turn=1"} {
		res, err := http.Get(base + bad)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", bad, res.StatusCode, body)
		}
	}
	if got := readSSE(t, base+"&time="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), ""); len(got) != 0 {
		t.Errorf("from an hour ahead: %v", got)
	}
	// From a turn: three turns stored as a node numbers them; turn 2
	// starts at its user text (event 5).
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	var n uint64
	for turn := 1; turn <= 3; turn++ {
		for _, ev := range []schemas.Event{
			{Turn: turn - 1, Payload: schemas.UserText{Content: schemas.Text("go")}},
			{Turn: turn, Payload: schemas.Status{Status: schemas.StatusWorking}},
			{Turn: turn, Payload: schemas.TurnStarted{}},
			{Turn: turn, Payload: schemas.Result{StopReason: schemas.StopEndTurn}},
		} {
			n++
			b, err := schemas.Encode(ev)
			if err != nil {
				t.Fatal(err)
			}
			msg := nats.NewMsg(schemas.EventSubject("turns"))
			msg.Data = b
			msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID("turns", n))
			if _, err := js.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(web.New(web.Config{Client: f}))
	t.Cleanup(hs.Close)
	if got := readSSE(t, hs.URL+"/api/agents/turns/events?follow=0&turn=2", ""); !slices.Equal(got, span(5, 12)) {
		t.Errorf("from turn 2: %v", got)
	}
	res, err := http.Get(url + "/api/agents/resume/events?event=x")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("a malformed event number: %d", res.StatusCode)
	}
}

// BenchmarkSSEVsOrderedConsumer reads one agent's stored events through
// the dashboard's event stream (an HTTP client parsing the SSE ids) and,
// in the same run, with a raw JetStream ordered consumer, and reports
// both rates and their ratio.
func BenchmarkSSEVsOrderedConsumer(b *testing.B) {
	const m = 10000
	url, js := storedDash(b, "bench", m)
	stream, err := js.Stream(b.Context(), schemas.StreamName)
	if err != nil {
		b.Fatal(err)
	}
	var sseTime, rawTime time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if got := readSSE(b, url+"/api/agents/bench/events?follow=0", ""); len(got) != m {
			b.Fatalf("streamed %d of %d", len(got), m)
		}
		sseTime += time.Since(start)

		start = time.Now()
		cons, err := stream.OrderedConsumer(b.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject("bench")}})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			b.Fatal(err)
		}
		for range m {
			if _, err := it.Next(); err != nil {
				b.Fatal(err)
			}
		}
		it.Stop()
		rawTime += time.Since(start)
	}
	b.StopTimer()
	sseRate := float64(m*b.N) / sseTime.Seconds()
	rawRate := float64(m*b.N) / rawTime.Seconds()
	b.ReportMetric(sseRate, "sse-events/s")
	b.ReportMetric(rawRate, "raw-events/s")
	b.ReportMetric(sseRate/rawRate, "ratio")
}
