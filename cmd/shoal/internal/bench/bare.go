package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// The bare rounds measure what nats bench measures: throughput to the
// stream with nobody reading it. No subscriber, bus or replay watches
// them; a round of the node is its agents' turns run at once (agent_run,
// whose reply comes once the turn's events are stored) from the first
// send to the last reply, and each anchor publishes as many of the same
// envelopes from its first publish to its last acknowledgement. The
// events a round stored are read from each agent's last event number.

// bareRounds runs turns rounds of turns on every agent, each followed by
// a floor round through fl and every anchor's publishes, and returns the
// node's events/s and each anchor's.
func bareRounds(ctx context.Context, url, node string, f client.Client, js jetstream.JetStream, agents []*agent, turns int, envelopes [][]byte, fl *floor) (float64, []AnchorRate, error) {
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return 0, nil, fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	raws := make([]*rawBaseline, len(Anchors))
	for i, way := range Anchors {
		raw, err := newBareBaseline(url, way, node)
		if err != nil {
			return 0, nil, err
		}
		defer raw.close()
		raws[i] = raw
	}
	var nodeTime time.Duration
	var nodeEvents int64
	rawTime := make([]time.Duration, len(raws))
	for t := 1; t <= turns; t++ {
		before, err := lastNumbers(ctx, stream, agents)
		if err != nil {
			return 0, nil, err
		}
		start := time.Now()
		err = parallel(len(agents), len(agents), func(i int) error {
			rep, err := f.Run(ctx, schemas.RunRequest{AgentID: agents[i].id, Text: fmt.Sprintf("bare turn %d", t), Timeout: 600})
			if err == nil && rep.StopReason != "" && rep.StopReason != schemas.StopEndTurn {
				err = fmt.Errorf("the turn ended %s", rep.StopReason)
			}
			if err != nil {
				return fmt.Errorf("agent %s, bare turn %d: %w", agents[i].id, t, err)
			}
			return nil
		})
		if err != nil {
			return 0, nil, err
		}
		took := time.Since(start)
		after, err := lastNumbers(ctx, stream, agents)
		if err != nil {
			return 0, nil, err
		}
		var events int64
		for i := range agents {
			events += int64(after[i] - before[i])
		}
		nodeTime += took
		nodeEvents += events
		if err := fl.round(ctx, len(agents)); err != nil {
			return 0, nil, fmt.Errorf("the floor, bare round %d: %w", t, err)
		}
		for i, raw := range raws {
			d, err := raw.publish(ctx, envelopes, int(events))
			if err != nil {
				return 0, nil, fmt.Errorf("%s, bare: %w", raw.way, err)
			}
			rawTime[i] += d
		}
	}
	if nodeTime <= 0 {
		return 0, nil, errors.New("the bare rounds took no time")
	}
	rate := float64(nodeEvents) / nodeTime.Seconds()
	var anchors []AnchorRate
	for i, way := range Anchors {
		a := AnchorRate{Anchor: way, Rate: float64(nodeEvents) / rawTime[i].Seconds()}
		a.Ratio = rate / a.Rate
		anchors = append(anchors, a)
	}
	return rate, anchors, nil
}

// newBareBaseline is an anchor's publisher with nobody watching it: its
// publishes end with their acknowledgements.
func newBareBaseline(url string, way Anchor, node string) (*rawBaseline, error) {
	r, err := dialBaseline(url, way, node, "bare")
	if err == nil {
		r.bare = true
	}
	return r, err
}

// lastNumbers is each agent's last event number in the stream.
func lastNumbers(ctx context.Context, stream jetstream.Stream, agents []*agent) ([]uint64, error) {
	out := make([]uint64, len(agents))
	err := parallel(len(agents), 16, func(i int) error {
		m, err := stream.GetLastMsgForSubject(ctx, schemas.EventSubject(agents[i].id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // none stored yet
		}
		if err != nil {
			return fmt.Errorf("agent %s's last event: %w", agents[i].id, err)
		}
		_, n, err := schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID))
		if err != nil {
			return fmt.Errorf("agent %s's last event: %w", agents[i].id, err)
		}
		out[i] = n
		return nil
	})
	return out, err
}
