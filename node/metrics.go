package node

import (
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// Metrics receives what a node counts, for an operator's monitoring (the
// shoal binary exports it to Prometheus). Its methods are called from
// many goroutines and must not block. Config.Metrics; nil counts nothing.
// What a node holds at a moment is read with Host.AgentsByStatus and
// Host.OutboxDepth.
type Metrics interface {
	// TurnStarted counts a turn the node began (its turn_started event).
	TurnStarted()
	// TurnEnded counts a turn's end (its result event) by stop reason.
	TurnEnded(stop schemas.StopReason)
	// EventStored counts an event the stream acknowledged, with the time
	// from the event's production to the acknowledgement.
	EventStored(latency time.Duration)
	// RequestFailed counts an error reply of the node's control service.
	RequestFailed(verb schemas.Verb, code schemas.ErrorCode)
}

// noMetrics counts nothing.
type noMetrics struct{}

func (noMetrics) TurnStarted()                                  {}
func (noMetrics) TurnEnded(schemas.StopReason)                  {}
func (noMetrics) EventStored(time.Duration)                     {}
func (noMetrics) RequestFailed(schemas.Verb, schemas.ErrorCode) {}

// countEvent counts what an event of an agent says about its turns.
func (h *Host) countEvent(ev schemas.Event) {
	switch p := ev.Payload.(type) {
	case schemas.TurnStarted:
		h.cfg.Metrics.TurnStarted()
	case schemas.Result:
		h.cfg.Metrics.TurnEnded(p.StopReason)
	}
}

// AgentsByStatus counts the agents the node keeps by status, dead ones
// kept for review included; every status an agent record can hold is
// present, with 0 for none.
func (h *Host) AgentsByStatus() map[schemas.AgentStatus]int {
	out := map[schemas.AgentStatus]int{}
	for _, s := range []schemas.AgentStatus{schemas.StatusStarting, schemas.StatusIdle, schemas.StatusWorking, schemas.StatusDead} {
		out[s] = 0
	}
	h.mu.Lock()
	agents := make([]*agent, 0, len(h.agents))
	for _, a := range h.agents {
		agents = append(agents, a)
	}
	h.mu.Unlock()
	for _, a := range agents {
		out[a.status()]++
	}
	return out
}

// OutboxDepth is how many events wait to be stored: in flight, in memory
// and on disk. 0 before the node runs.
func (h *Host) OutboxDepth() int {
	h.mu.Lock()
	pub := h.pub
	h.mu.Unlock()
	if pub == nil {
		return 0
	}
	return pub.pending()
}
