package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/bench"
)

// TestBenchShort runs `shoal bench --short --nodes 2 --json`, the real
// binary with its node processes and stand-in CLIs, and checks that every figure is
// there and positive, and that the bench found every stream gapless and
// every turn ended. Rates are not compared with anything.
func TestBenchShort(t *testing.T) {
	code, stdout, stderr := runShoal(t, t.TempDir(), nil, "bench", "--short", "--nodes", "2", "--json")
	if code != 0 {
		t.Fatalf("shoal bench exited %d:\n%s\n%s", code, stdout, stderr)
	}
	var r bench.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("the report is not JSON: %v\n%s", err, stdout)
	}
	if r.Agents != 4 || r.Turns != 2 || r.EventsPerTurn != 2000 || r.Fabric != "embedded" || r.Nodes != 2 {
		t.Fatalf("--short ran %d agents × %d turns × %d deltas on %q with %d nodes", r.Agents, r.Turns, r.EventsPerTurn, r.Fabric, r.Nodes)
	}
	if len(r.Anchors) != len(bench.Anchors) || len(r.BareAnchors) != len(bench.Anchors) {
		t.Errorf("anchors: %d watched, %d bare; want %d each", len(r.Anchors), len(r.BareAnchors), len(bench.Anchors))
	}
	for i, a := range append(append([]bench.AnchorRate(nil), r.Anchors...), r.BareAnchors...) {
		if a.Anchor != bench.Anchors[i%len(bench.Anchors)] || !(a.Rate > 0) || !(a.Ratio > 0) {
			t.Errorf("anchor %d: %+v", i, a)
		}
	}
	if r.BareFloor.Anchor != bench.AnchorFloor || !(r.BareFloor.Rate > 0) || !(r.BareFloor.Ratio > 0) {
		t.Errorf("the floor's rate: %+v", r.BareFloor)
	}
	for name, v := range map[string]float64{
		"events": float64(r.Events), "node events/s": r.NodeRate, "bare node events/s": r.BareRate, "raw events/s": r.RawRate, "ratio": r.Ratio,
		"bus events/s": r.BusRate, "raw zmq4 events/s": r.RawZMQRate, "bus ratio": r.BusRatio,
		"node RSS before": float64(r.NodeRSSBefore), "node RSS open": float64(r.NodeRSSOpen), "node RSS after": float64(r.NodeRSSAfter),
	} {
		if !(v > 0) {
			t.Errorf("%s is %v", name, v)
		}
	}
	for name, l := range map[string]bench.Latency{"stored": r.Stored, "stored, bare": r.StoredBare, "floor stored, bare": r.FloorStoredBare, "core subscriber": r.Core, "bus": r.Bus, "following replay": r.Replay, "open": r.Open} {
		if l.Samples == 0 || !(l.P50 > 0) || l.P99 < l.P50 || l.Max < l.P99 {
			t.Errorf("%s latency: %+v", name, l)
		}
	}
	// Deltas of each phase: the bare rounds, then the watched ones.
	deltas := int64(r.Agents * r.Turns * r.EventsPerTurn)
	if r.FloorStoredBare.Samples != int(deltas) {
		t.Errorf("the floor's latency samples: %d; its stand-ins printed %d deltas", r.FloorStoredBare.Samples, deltas)
	}
	if r.StoredBare.Samples != int(deltas) || r.Stored.Samples != int(deltas) || r.Core.Samples != int(deltas) || r.Bus.Samples != int(deltas) || r.Replay.Samples != int(deltas) {
		t.Errorf("latency samples: stored bare %d, stored %d, core %d, bus %d, replay %d; the stand-ins printed %d deltas in each phase",
			r.StoredBare.Samples, r.Stored.Samples, r.Core.Samples, r.Bus.Samples, r.Replay.Samples, deltas)
	}
	if r.BusEvents != r.Verified.Stored || r.BusEvents <= r.Events {
		t.Errorf("the fresh bus carried %d events; the stream holds %d of the agents' (%d of their turns)", r.BusEvents, r.Verified.Stored, r.Events)
	}
	if r.Events <= 2*deltas {
		t.Errorf("%d events stored for %d deltas: the turns' other events (status, result) are missing", r.Events, deltas)
	}
	if fl := r.Fleet; fl == nil || fl.NodesRegistered != 20 || fl.Opens != 100 || fl.Placement.Samples != 100 ||
		!(fl.Heartbeat.MsgsPerSec > 0) || !(fl.Heartbeat.BytesInPerSec > 0) || fl.NodesUsed < 2 || fl.Heartbeat.FailedBeats != 0 {
		t.Errorf("the fleet figure of --short (20 nodes, 100 opens): %+v", fl)
	}
	v := r.Verified
	if v.Gapless != r.Agents || v.TurnsEnded != 2*r.Agents*r.Turns || v.TurnsExpected != 2*r.Agents*r.Turns || v.Deltas != 2*deltas || len(v.Problems) > 0 {
		t.Errorf("verified: %+v", v)
	}
}

// TestBenchPacedMeasuresTheFloor runs a paced bench: beside the node, the
// same number of stand-ins at the same rate are read by a floor process
// that publishes each line straight to JetStream, in the watched and the
// bare rounds, and the report gives its latency to stored and to the bus
// for every delta, and the node's p99 over it.
func TestBenchPacedMeasuresTheFloor(t *testing.T) {
	code, stdout, stderr := runShoal(t, t.TempDir(), nil, "bench", "--agents", "3", "--events", "400", "--rate", "1000", "--turns", "2", "--fleet", "0", "--json")
	if code != 0 {
		t.Fatalf("shoal bench exited %d:\n%s\n%s", code, stdout, stderr)
	}
	var r bench.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("the report is not JSON: %v\n%s", err, stdout)
	}
	deltas := r.Agents * r.Turns * r.EventsPerTurn
	for name, l := range map[string]bench.Latency{"floor stored": r.FloorStored, "floor stored, bare": r.FloorStoredBare, "floor bus": r.FloorBus,
		"stored": r.Stored, "stored, bare": r.StoredBare, "bus": r.Bus} {
		if l.Samples != deltas || !(l.P50 > 0) || l.P99 < l.P50 || l.Max < l.P99 {
			t.Errorf("%s latency: %+v; want %d samples", name, l, deltas)
		}
	}
	if !r.Verified.OK(r.Agents) {
		t.Errorf("verified: %+v", r.Verified)
	}
	if !(r.BareFloor.Rate > 0) {
		t.Errorf("the floor's rate: %+v", r.BareFloor)
	}
	var out strings.Builder
	printBench(&out, &r)
	for _, want := range []string{"the floor: the lines straight to JetStream", "p99 over the floor's"} {
		if strings.Count(out.String(), want) == 0 {
			t.Errorf("the printed report lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), string(bench.AnchorFloor)) {
		t.Errorf("the printed report lacks the floor's rate:\n%s", out.String())
	}
	if n := strings.Count(out.String(), "the floor: the lines straight to JetStream"); n != 3 {
		t.Errorf("%d floor rows printed, want 3 (stored bare, stored watched, bus):\n%s", n, out.String())
	}
}

// TestBenchRefusesNoAgents checks the load flags are validated before
// anything starts.
func TestBenchRefusesNoAgents(t *testing.T) {
	code, _, stderr := runShoal(t, t.TempDir(), nil, "bench", "--agents", "0")
	if code != exitUsage {
		t.Fatalf("shoal bench --agents 0 exited %d: %s", code, stderr)
	}
}
