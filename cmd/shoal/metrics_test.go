package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// scrape reads a /metrics endpoint with the Prometheus text parser.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, url string) scrape {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// value is the metric of family name whose labels include labels, or -1
// when there is none: a counter's or gauge's value, a histogram's count.
func (s scrape) value(name string, labels ...string) float64 {
	fam := s[name]
	if fam == nil {
		return -1
	}
next:
	for _, m := range fam.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// A known run, scraped: a coordinator with --auth and a confined node,
// each with --metrics. One agent opened and run for one turn over MCP, an
// MCP call that fails, one with bad arguments, and a forged event the
// relay refuses; the node's and the coordinator's /metrics say exactly
// that.
func TestMetricsAfterAKnownRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authDir := filepath.Join(dir, "keys")
	creds := filepath.Join(dir, "box.creds")
	if code, _, errOut := runShoal(t, dir, nil, "creds", "node", "box", "--out", creds, "--auth-dir", authDir); code != 0 {
		t.Fatal(errOut)
	}
	up := startShoal(t, dir, nil, "up", "--auth", "--auth-dir", authDir, "--port", "-1", "--no-node", "--no-bus",
		"--mcp-listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	upMetrics := strings.TrimPrefix(up.waitLine("shoal: metrics "), "shoal: metrics ")
	endpoint := strings.TrimPrefix(up.waitLine("shoal: MCP endpoint "), "shoal: MCP endpoint ")
	up.waitLine("shoal: ready")

	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: "Counted."})
	home := filepath.Join(dir, "box")
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	n := startShoal(t, home, env, "node", "--nats", url, "--creds", creds, "--claude", peers.Claude.Command(t)[0],
		"--stop-wait", "500ms", "--metrics", "127.0.0.1:0")
	nodeMetrics := strings.TrimPrefix(n.waitLine("shoal: metrics "), "shoal: metrics ")
	n.waitLine("shoal: node box joined")

	c := mcp.NewClient(&mcp.Implementation{Name: "metrics-test", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	call := func(tool string, args map[string]any, wantError bool) string {
		t.Helper()
		text, isErr, err := callText(t.Context(), s, tool, args)
		if err != nil || isErr != wantError {
			t.Fatalf("%s %v: %q error %v, %v", tool, args, text, isErr, err)
		}
		return text
	}
	poll.Until(t, 20*time.Second, "the node is placed", func() bool {
		return strings.Contains(call("agent_nodes", map[string]any{}, false), `"box"`)
	})
	call("agent_open", map[string]any{"cwd": t.TempDir(), "id": "m1"}, false)
	if out := call("agent_run", map[string]any{"agent_id": "m1", "text": "Count this."}, false); !strings.Contains(out, "Counted.") {
		t.Fatalf("agent_run: %s", out)
	}
	call("agent_status", map[string]any{"agent_id": "nope"}, true)
	call("agent_send", map[string]any{"agent_id": "m1"}, true) // no text
	var page schemas.EventsReply
	if err := json.Unmarshal([]byte(call("agent_events", map[string]any{"agent_id": "m1", "include_deltas": true, "max": 5000}, false)), &page); err != nil || page.More {
		t.Fatalf("agent_events: %+v %v", page, err)
	}
	stored := float64(len(page.Events))

	// A forged event for an agent the node was never given.
	forger, err := nats.Connect(url, nats.UserCredentials(creds), nats.CustomInboxPrefix(schemas.InboxPrefix("node", "box")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(forger.Close)
	js, err := jetstream.New(forger)
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.NewMsg(schemas.RelaySubject("box", schemas.RelayEvent, "nope"))
	forged.Header.Set(schemas.HeaderMsgID, schemas.MsgID("nope", 1))
	forged.Header.Set(schemas.HeaderNode, "box")
	forged.Data = []byte(`{"kind":"error","turn":1,"data":{"message":"forged","data":null}}`)
	pctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var apiErr *jetstream.APIError
	if _, err := js.PublishMsg(pctx, forged); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Fatalf("the forged event: %v", err)
	}

	var nm scrape
	poll.Until(t, 20*time.Second, "the node's counts settle", func() bool {
		nm = scrapeMetrics(t, nodeMetrics)
		return nm.value("shoal_events_published_total", "node", "box") == stored && nm.value("shoal_outbox_events", "node", "box") == 0
	})
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"shoal_agents", []string{"node", "box", "status", "idle"}, 1},
		{"shoal_agents", []string{"node", "box", "status", "working"}, 0},
		{"shoal_turns_started_total", []string{"node", "box"}, 1},
		{"shoal_turns_ended_total", []string{"node", "box", "stop_reason", "end_turn"}, 1},
		{"shoal_turns_ended_total", []string{"node", "box", "stop_reason", "cancelled"}, 0},
		{"shoal_events_published_total", []string{"node", "box"}, stored},
		{"shoal_event_publish_latency_seconds", []string{"node", "box"}, stored},
		{"shoal_outbox_events", []string{"node", "box"}, 0},
	} {
		if got := nm.value(want.name, want.labels...); got != want.value {
			t.Errorf("node: %s%v = %v, want %v", want.name, want.labels, got, want.value)
		}
	}
	um := scrapeMetrics(t, upMetrics)
	// The metrics are for people: a scrape that carries an agent's marks
	// is refused by the rights rules.
	for _, mark := range []map[string]string{{schemas.AgentIDHeader: "a1"}, {"Authorization": "Bearer " + schemas.AgentToken("t", "a1", "r")}} {
		for _, u := range []string{upMetrics, nodeMetrics} {
			req, _ := http.NewRequest(http.MethodGet, u, nil)
			for k, v := range mark {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "may not read the metrics: rule side-doors") {
				t.Errorf("GET %s with %v: %d %s", u, mark, res.StatusCode, body)
			}
		}
	}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"shoal_mcp_calls_total", []string{"tool", "agent_open", "outcome", "ok"}, 1},
		{"shoal_mcp_calls_total", []string{"tool", "agent_run", "outcome", "ok"}, 1},
		{"shoal_mcp_calls_total", []string{"tool", "agent_status", "outcome", "error"}, 1},
		{"shoal_mcp_calls_total", []string{"tool", "agent_send", "outcome", "invalid"}, 1},
		{"shoal_relay_refusals_total", []string{"op", "event"}, 1},
		{"shoal_relay_refusals_total", []string{"op", "record"}, 0},
		{"shoal_fabric_agents", []string{"status", "idle"}, 1},
	} {
		if got := um.value(want.name, want.labels...); got != want.value {
			t.Errorf("coordinator: %s%v = %v, want %v", want.name, want.labels, got, want.value)
		}
	}
	if stored < 5 {
		t.Errorf("the turn stored only %v events", stored)
	}
	// What the turn used, by node and model, from the coordinator's count
	// of the stream's result events.
	var used schemas.Usage
	for _, ev := range page.Events {
		var e struct {
			Kind string `json:"kind"`
			Data struct {
				Usage *schemas.Usage `json:"usage"`
			} `json:"data"`
		}
		if json.Unmarshal(ev.Event, &e) == nil && e.Kind == "result" && e.Data.Usage != nil {
			used.Add(*e.Data.Usage)
		}
	}
	if used.InputTokens == 0 {
		t.Fatalf("the turn's result says it used nothing")
	}
	poll.Until(t, 20*time.Second, "the coordinator counts the turn", func() bool {
		return scrapeMetrics(t, upMetrics).value("shoal_spent_turns_total", "node", "box") == 1
	})
	um = scrapeMetrics(t, upMetrics)
	for kind, n := range map[string]int64{"input": used.InputTokens, "output": used.OutputTokens, "cache_read": used.CacheReadTokens, "cache_write": used.CacheCreationTokens} {
		if got := um.value("shoal_spent_tokens_total", "node", "box", "kind", kind); got != float64(n) {
			t.Errorf("coordinator: shoal_spent_tokens_total{node=box,kind=%s} = %v, want %d", kind, got, n)
		}
	}
	if got := um.value("shoal_spent_turns_total", "node", "box", "model", "sonnet"); got != 1 {
		t.Errorf("coordinator: shoal_spent_turns_total{node=box,model=sonnet} = %v, want 1", got)
	}
}
