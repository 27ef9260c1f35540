package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shoalfabric/shoal/schemas"
)

// Registry is one process's metrics.
type Registry struct {
	reg *prometheus.Registry
}

// New returns a registry with the Go runtime's and the process's metrics.
func New() *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Registry{reg: reg}
}

// Handler serves the registry in the Prometheus exposition formats.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

// refuseAgents keeps agents out: a request that carries an agent's marks
// (its id header, its own token) is refused by the rights rules, as the
// dashboard refuses it.
func refuseAgents(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := schemas.BearerToken(r.Header.Get("Authorization"))
		if _, marked := r.Header[http.CanonicalHeaderKey(schemas.AgentIDHeader)]; marked || schemas.IsAgentToken(token) {
			p := schemas.Principal{Kind: schemas.KindAgent, Agent: r.Header.Get(schemas.AgentIDHeader)}
			err := schemas.Decide(p, schemas.AccessSideDoor, schemas.Target{}).Err(p, "read the metrics", schemas.Target{})
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHosts refuses a request whose Host is not a loopback name or
// address: a page of another site whose name it made resolve to
// 127.0.0.1 (DNS rebinding) reaches a loopback listener with its own
// name as the Host, and could read the metrics from a browser on this
// machine.
func loopbackHosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if ip := net.ParseIP(strings.Trim(host, "[]")); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, "host not allowed: "+r.Host+" (this listener answers loopback names only)", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Listen binds addr (host:port; port 0 picks a free one) and returns the
// URL of /metrics there and a function that serves it until ctx ends.
func (r *Registry) Listen(addr string) (url string, serve func(ctx context.Context) error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	var h http.Handler = refuseAgents(r.Handler())
	if ip := ln.Addr().(*net.TCPAddr).IP; ip.IsLoopback() {
		h = loopbackHosts(h)
	}
	mux.Handle("GET /metrics", h)
	// Each request is read whole in 30 s (a body declared and never sent
	// holds no connection), and an idle connection goes after a minute.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	serve = func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
		})
		defer stop()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return "http://" + ln.Addr().String() + "/metrics", serve, nil
}

// byStatus is a gauge of agents by status, read at each scrape.
type byStatus struct {
	desc  *prometheus.Desc
	count func() map[schemas.AgentStatus]int
}

func (b byStatus) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b byStatus) Collect(ch chan<- prometheus.Metric) {
	for status, n := range b.count() {
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, float64(n), string(status))
	}
}

// latencyBuckets span an event stored at once (under a millisecond) to
// one that waited out an outage in the outbox (minutes).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// stopReasons are the stop reasons a turn's result carries, counted from
// zero so a rate over any of them is defined.
var stopReasons = []schemas.StopReason{schemas.StopEndTurn, schemas.StopMaxTokens, schemas.StopMaxTurnRequests, schemas.StopRefusal, schemas.StopCancelled}

// Node is the metrics of one node; it satisfies node.Metrics.
type Node struct {
	reg          prometheus.Registerer
	turnsStarted prometheus.Counter
	turnsEnded   *prometheus.CounterVec
	published    prometheus.Counter
	latency      prometheus.Histogram
	errors       *prometheus.CounterVec
}

// Node registers the metrics of node name.
func (r *Registry) Node(name string) *Node {
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"node": name}, r.reg)
	n := &Node{
		reg: reg,
		turnsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_turns_started_total", Help: "Turns the node began.",
		}),
		turnsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_turns_ended_total", Help: "Turns that ended, by the stop reason of their result.",
		}, []string{"stop_reason"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_events_published_total", Help: "Agent events the stream stored.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shoal_event_publish_latency_seconds", Help: "Time from an event's production to the stream's acknowledgement.",
			Buckets: latencyBuckets,
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_node_request_errors_total", Help: "Error replies of the node's control service, by verb and error code.",
		}, []string{"verb", "code"}),
	}
	for _, s := range stopReasons {
		n.turnsEnded.WithLabelValues(string(s))
	}
	reg.MustRegister(n.turnsStarted, n.turnsEnded, n.published, n.latency, n.errors)
	return n
}

// Watch registers the node's gauges, read at each scrape: its agents by
// status and its outbox depth.
func (n *Node) Watch(agents func() map[schemas.AgentStatus]int, outbox func() int) {
	n.reg.MustRegister(
		byStatus{prometheus.NewDesc("shoal_agents", "Agents the node keeps, by status (dead ones kept for review included).", []string{"status"}, nil), agents},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shoal_outbox_events", Help: "Events waiting to be stored: in flight, in memory and on disk.",
		}, func() float64 { return float64(outbox()) }),
	)
}

// TurnStarted implements node.Metrics.
func (n *Node) TurnStarted() { n.turnsStarted.Inc() }

// TurnEnded implements node.Metrics.
func (n *Node) TurnEnded(stop schemas.StopReason) { n.turnsEnded.WithLabelValues(string(stop)).Inc() }

// EventStored implements node.Metrics.
func (n *Node) EventStored(latency time.Duration) {
	n.published.Inc()
	n.latency.Observe(latency.Seconds())
}

// RequestFailed implements node.Metrics.
func (n *Node) RequestFailed(verb schemas.Verb, code schemas.ErrorCode) {
	n.errors.WithLabelValues(string(verb), string(code)).Inc()
}

// Coordinator is the metrics of the coordinator's services; it satisfies
// coordinator.RelayMetrics, coordinator.ServiceMetrics and
// bridge.MCPMetrics.
type Coordinator struct {
	reg      prometheus.Registerer
	refusals *prometheus.CounterVec
	calls    *prometheus.CounterVec
	errors   *prometheus.CounterVec

	spentMu sync.Mutex
	spent   func() []schemas.SpentRow // nil until WatchSpend
}

// Coordinator registers the coordinator's metrics.
func (r *Registry) Coordinator() *Coordinator {
	c := &Coordinator{
		reg: r.reg,
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_relay_refusals_total", Help: "Writes of confined nodes the relay refused, by relay operation.",
		}, []string{"op"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_mcp_calls_total", Help: "MCP tool calls, by tool and outcome (ok, invalid, refused, error).",
		}, []string{"tool", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_fabric_request_errors_total", Help: "Error replies of the coordinator's fabric service, by verb and error code.",
		}, []string{"verb", "code"}),
	}
	for _, op := range []schemas.RelayOp{schemas.RelayEvent, schemas.RelayRecord, schemas.RelayBeat} {
		c.refusals.WithLabelValues(string(op))
	}
	r.reg.MustRegister(c.refusals, c.calls, c.errors)
	return c
}

// WatchAgents registers the fabric's agents by status, read at each
// scrape.
func (c *Coordinator) WatchAgents(agents func() map[schemas.AgentStatus]int) {
	c.reg.MustRegister(byStatus{prometheus.NewDesc("shoal_fabric_agents", "The fabric's agent records, by status.", []string{"status"}, nil), agents})
}

// WatchSpend registers what the fleet's turns used, by node and model,
// read at each scrape from spent: the ledger's count, so the counters go
// on from where they were across restarts. A ledger made again (its
// connection was replaced) calls it again; the last one given is read.
func (c *Coordinator) WatchSpend(spent func() []schemas.SpentRow) {
	c.spentMu.Lock()
	first := c.spent == nil
	c.spent = spent
	c.spentMu.Unlock()
	if first {
		c.reg.MustRegister(spendCounters{c})
	}
}

// spendCounters are the spend ledger's counts as Prometheus counters.
type spendCounters struct{ c *Coordinator }

var (
	spentTokensDesc = prometheus.NewDesc("shoal_spent_tokens_total", "Tokens the fleet's turns used, by node, model and kind (input, output, cache_read, cache_write), from the result events.", []string{"node", "model", "kind"}, nil)
	spentUSDDesc    = prometheus.NewDesc("shoal_spent_usd_total", "Dollars the fleet's turns cost, by node and model, where the CLI reported a cost.", []string{"node", "model"}, nil)
	spentTurnsDesc  = prometheus.NewDesc("shoal_spent_turns_total", "Turns counted by the spend ledger, by node and model.", []string{"node", "model"}, nil)
)

func (spendCounters) Describe(ch chan<- *prometheus.Desc) {
	ch <- spentTokensDesc
	ch <- spentUSDDesc
	ch <- spentTurnsDesc
}

func (s spendCounters) Collect(ch chan<- prometheus.Metric) {
	s.c.spentMu.Lock()
	spent := s.c.spent
	s.c.spentMu.Unlock()
	type key struct{ node, model string }
	type sum struct {
		turns int64
		u     schemas.Usage
	}
	sums := map[key]*sum{}
	for _, r := range spent() {
		k := key{r.Node, modelLabel(r.Model)}
		if sums[k] == nil {
			sums[k] = &sum{}
		}
		sums[k].turns += r.Turns
		sums[k].u.Add(r.Usage)
	}
	for k, v := range sums {
		for kind, n := range map[string]int64{"input": v.u.InputTokens, "output": v.u.OutputTokens, "cache_read": v.u.CacheReadTokens, "cache_write": v.u.CacheCreationTokens} {
			ch <- prometheus.MustNewConstMetric(spentTokensDesc, prometheus.CounterValue, float64(n), k.node, k.model, kind)
		}
		if v.u.CostUSD != nil {
			ch <- prometheus.MustNewConstMetric(spentUSDDesc, prometheus.CounterValue, *v.u.CostUSD, k.node, k.model)
		}
		ch <- prometheus.MustNewConstMetric(spentTurnsDesc, prometheus.CounterValue, float64(v.turns), k.node, k.model)
	}
}

// modelLabel is model as a metric's label: a model's name (letters,
// digits and . _ - : / @, at most 64) as it is, anything else "other".
// The open's model is any string its caller gave (up to 256 characters),
// and a label is neither content nor a place for it.
func modelLabel(model string) string {
	if model == "" || len(model) > 64 {
		return "other"
	}
	for _, c := range model {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("._-:/@", c):
		default:
			return "other"
		}
	}
	return model
}

// Refused implements coordinator.RelayMetrics.
func (c *Coordinator) Refused(op schemas.RelayOp) { c.refusals.WithLabelValues(string(op)).Inc() }

// RequestFailed implements coordinator.ServiceMetrics.
func (c *Coordinator) RequestFailed(verb schemas.Verb, code schemas.ErrorCode) {
	c.errors.WithLabelValues(string(verb), string(code)).Inc()
}

// ToolCalled implements bridge.MCPMetrics.
func (c *Coordinator) ToolCalled(tool, outcome string) { c.calls.WithLabelValues(tool, outcome).Inc() }
