package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// MonitorConfig configures the node-loss monitor.
type MonitorConfig struct {
	Conn *nats.Conn
	// Name is what the monitor's events carry as their producer; "coordinator"
	// when empty.
	Name string
	// Grace is how long after starting the monitor waits before it takes
	// nodes that never showed up for lost; 3× the bucket TTL when zero.
	Grace  time.Duration
	Logger *slog.Logger
}

// Monitor watches the nodes' heartbeats. When a node's entry expires (or
// it leaves), the agents its records still call live are lost: each
// record is marked dead with a compare-and-set, and each stream is closed
// with an error naming the node, a cancelled result for an open turn, and
// status dead. Several coordinators may run one each; the compare-and-set
// decides which closes an agent.
type Monitor struct {
	cfg   MonitorConfig
	log   *slog.Logger
	js    jetstream.JetStream
	ready chan struct{}
}

// NewMonitor checks cfg.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	if cfg.Conn == nil {
		return nil, errors.New("the monitor needs a NATS connection")
	}
	if cfg.Name == "" {
		cfg.Name = "coordinator"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	return &Monitor{cfg: cfg, log: cfg.Logger.With("component", "monitor"), js: js, ready: make(chan struct{})}, nil
}

// Ready is closed once the monitor watches the heartbeats.
func (m *Monitor) Ready() <-chan struct{} { return m.ready }

// Run watches until ctx ends.
func (m *Monitor) Run(ctx context.Context) error {
	nodes, err := m.js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.NodesBucket, err)
	}
	agents, err := m.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.AgentsBucket, err)
	}
	stream, err := m.js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	grace := m.cfg.Grace
	if grace == 0 {
		st, err := nodes.Status(ctx)
		if err != nil {
			return err
		}
		grace = 3 * st.TTL()
	}
	w, err := nodes.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer w.Stop()
	// A coordinator that starts (or restarts) gives nodes the grace period
	// to check in: entries that expired while it was down are not losses
	// yet. After it, nodes that have not come back are lost, and from then
	// on every expiry is.
	present := map[string]bool{}
	settled := false
	sweep := time.NewTimer(grace)
	defer sweep.Stop()
	close(m.ready)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweep.C:
			settled = true
			m.sweep(ctx, agents, stream, func(node string) bool { return !present[node] })
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the node watch ended")
			}
			if e == nil {
				continue
			}
			gone := e.Operation() != jetstream.KeyValuePut
			if gone {
				delete(present, e.Key())
			} else {
				present[e.Key()] = true
			}
			if gone && settled {
				node := e.Key()
				m.log.Warn("node lost", "node", node)
				m.sweep(ctx, agents, stream, func(n string) bool { return n == node })
			}
		}
	}
}

// sweep closes the live agents of the nodes lost reports.
func (m *Monitor) sweep(ctx context.Context, agents jetstream.KeyValue, stream jetstream.Stream, lost func(node string) bool) {
	keys, err := agents.ListKeys(ctx)
	if err != nil {
		return
	}
	for id := range keys.Keys() {
		e, err := agents.Get(ctx, id)
		if err != nil {
			continue
		}
		var rec schemas.AgentRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Status == schemas.StatusDead || !lost(rec.Node) {
			continue
		}
		if err := m.closeLost(ctx, agents, stream, rec, e.Revision()); err != nil {
			m.log.Warn("cannot close a lost agent", "agent", id, "node", rec.Node, "err", err)
		}
	}
}

// closeLost marks one agent dead and closes its stream.
func (m *Monitor) closeLost(ctx context.Context, agents jetstream.KeyValue, stream jetstream.Stream, rec schemas.AgentRecord, rev uint64) error {
	dead := rec
	dead.Status = schemas.StatusDead
	b, _ := json.Marshal(dead)
	if _, err := agents.Update(ctx, rec.ID, b, rev); err != nil {
		return nil // its owner or another coordinator wrote first
	}
	tail, err := tailOf(ctx, m.cfg.Conn, stream, rec.ID)
	if err != nil {
		return err
	}
	n := tail.Last
	events := tail.Orphaned(rec.Turn, rec.Status == schemas.StatusWorking, "node "+rec.Node+" was lost")
	for _, ev := range events {
		n++
		env, err := schemas.Encode(ev)
		if err != nil {
			return err
		}
		msg := nats.NewMsg(schemas.EventSubject(rec.ID))
		msg.Data = env
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID(rec.ID, n))
		msg.Header.Set(schemas.HeaderNode, m.cfg.Name)
		msg.Header.Set(schemas.HeaderTime, time.Now().UTC().Format(time.RFC3339Nano))
		if _, err := m.js.PublishMsg(ctx, msg); err != nil {
			return err
		}
	}
	m.log.Info("closed a lost node's agent", "agent", rec.ID, "node", rec.Node)
	return nil
}
