package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/bench"
)

// benchOptions are the flags of `shoal bench`.
type benchOptions struct {
	nats       string
	nodes      int
	agents     int
	events     int
	turns      int
	rate       float64
	short      bool
	json       bool
	profile    string
	fleet      int
	fleetOpens int
	publish    string
}

func benchCommand() *command {
	return &command{
		name:    "bench",
		summary: "measure the fabric: a stand-in claude CLI through a real node against JetStream publishers in the same run",
		help: `
Measures a fabric from outside, in the manner of nats bench. It starts an
embedded NATS server with JetStream (or uses --nats URL), --nodes shoal
node processes whose claude CLI is a stand-in built into this binary (on
each turn it prints --events text deltas of claude's stream-json, as fast
as it can or --rate per second, then a result), a Kaimon bus with a
ZeroMQ subscriber, and opens --agents agents spread over the nodes. It
runs --turns rounds of turns on every agent at once, first watched (a
core subscriber, a following replay and the bus read everything) and
then bare (nobody reading, as nats bench runs), and after each round
publishes as many of the same envelopes straight to JetStream as four
anchors: an async publish per event with and without a Nats-Msg-Id, and
fast batches with and without (as nats bench js pub async [--dedup] and
fast publish). It prints, measured in the same run:

  the node pipeline's events/s (each round's first delta printed to its
  last result seen), each anchor's events/s and the node's ratio to it,
  watched and bare;
  latency p50/p99/max from a stand-in's stdout line to the event stored
  in the stream, to a core subscriber of agent.<id>, to the Kaimon bus's
  ZeroMQ subscriber, and to a following replay (up to 8 agents);
  the floor beside them: after each bare round (and, with --rate, each
  watched one) as many stand-ins, read by a process that does nothing but
  publish each line straight to JetStream the node's way (fast batches,
  or an async publish per event with --publish async, under the node's
  headers): its events/s with the node's ratio and, with --rate, its
  latency to stored and to the bus, and the node's p99 over it;
  a fresh bus's events/s for the agents' stored events against plain
  zmq4 PUB/SUB of as many of the same messages, with their ratio;
  the open's latency and the nodes' resident memory per open agent.

It then reads every agent's stream back and fails unless each is gapless
(events numbered 1, 2, … and every delta the stand-in printed, in order)
and every turn ended with a result counting what the stand-in printed.
Against --nats, the raw baseline's envelopes stay in that fabric's stream
under agent.bench-raw-*, agent.bench-bare-* and agent.bench-floor-*; the
bench's bus consumers are removed.

Last, --fleet fake nodes register on the fabric, write their records on
a real node's heartbeat interval, and take --fleet-opens opens through
placement: it prints the heartbeat load on the server and placement's
latency and spread.

--short (for CI) runs 4 agents × 2 turns × 2,000 deltas and a fleet of
20 beating every 250ms taking 100 opens, unless those flags are given. --profile writes the (first) node's CPU profile; any
shoal command writes its own with SHOAL_CPUPROFILE=file.`,
		flags: func(fs *flag.FlagSet) runner {
			o := &benchOptions{}
			fs.StringVar(&o.nats, "nats", "", "measure the fabric at this NATS `URL` instead of an embedded server")
			fs.IntVar(&o.agents, "agents", 1, "`n` agents at once, spread over the nodes")
			fs.IntVar(&o.nodes, "nodes", 1, "`n` node processes")
			fs.IntVar(&o.events, "events", 100_000, "text deltas per turn, `n`")
			fs.IntVar(&o.turns, "turns", 3, "turns per agent, `n`, one after another")
			fs.Float64Var(&o.rate, "rate", 0, "deltas per `second` each stand-in prints (0: as fast as it can)")
			fs.BoolVar(&o.short, "short", false, "a run of a few seconds, for CI")
			fs.StringVar(&o.publish, "publish", "batches", "how the nodes publish their events: `way` batches or async (shoal node --publish)")
			fs.IntVar(&o.fleet, "fleet", 100, "`n` fake nodes that register, beat and take opens, for the fleet figure (0: none)")
			fs.IntVar(&o.fleetOpens, "fleet-opens", 1000, "agents opened through placement among the fleet, `n`")
			fs.BoolVar(&o.json, "json", false, "print the report as JSON")
			fs.StringVar(&o.profile, "profile", "", "write the node's Go CPU profile to this `file`, for go tool pprof")
			return func(ctx context.Context, env *environment, args []string) error {
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				return o.run(ctx, env, set)
			}
		},
	}
}

func (o *benchOptions) run(ctx context.Context, env *environment, set map[string]bool) error {
	if o.short {
		if !set["agents"] {
			o.agents = 4
		}
		if !set["events"] {
			o.events = 2000
		}
		if !set["turns"] {
			o.turns = 2
		}
		if !set["fleet"] {
			o.fleet = 20
		}
		if !set["fleet-opens"] {
			o.fleetOpens = 100
		}
	}
	switch {
	case o.nodes < 1:
		return usagef("--nodes %d: at least one", o.nodes)
	case o.agents < 1:
		return usagef("--agents %d: at least one", o.agents)
	case o.events < 1:
		return usagef("--events %d: at least one", o.events)
	case o.turns < 1:
		return usagef("--turns %d: at least one", o.turns)
	case o.rate < 0:
		return usagef("--rate %v is negative", o.rate)
	case o.fleet < 0:
		return usagef("--fleet %d is negative", o.fleet)
	case o.fleet > 0 && o.fleetOpens < 1:
		return usagef("--fleet-opens %d: at least one", o.fleetOpens)
	}
	cfg := bench.Config{URL: o.nats, Nodes: o.nodes, Agents: o.agents, Events: o.events, Turns: o.turns, Rate: o.rate, Profile: o.profile, Progress: env.io.err,
		Fleet: o.fleet, FleetOpens: o.fleetOpens, Publish: o.publish}
	if o.short {
		cfg.FleetBeat = 250 * time.Millisecond // a short window; the interval is in the report
	}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if o.json {
		if err := printJSON(env, rep); err != nil {
			return err
		}
	} else {
		printBench(env.io.out, rep)
	}
	if !rep.Verified.OK(rep.Agents) {
		return fmt.Errorf("%d of %d agents' streams gapless, %d of %d turns ended: %s", rep.Verified.Gapless, rep.Agents,
			rep.Verified.TurnsEnded, rep.Verified.TurnsExpected, strings.Join(rep.Verified.Problems, "; "))
	}
	return nil
}

// printBench prints the report as tables a person reads.
func printBench(w io.Writer, r *bench.Report) {
	rate := "as fast as it can"
	if r.Rate > 0 {
		rate = fmt.Sprintf("%s/s per agent", thousands(r.Rate))
	}
	fmt.Fprintf(w, "shoal bench: %d agents × %d turns × %d deltas, %s; %s fabric, %d node processes\n\n",
		r.Agents, r.Turns, r.EventsPerTurn, rate, r.Fabric, r.Nodes)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tevents\tevents/s\traw baseline\traw events/s\tratio\t")
	rows := func(what string, rate float64, anchors []bench.AnchorRate) {
		for i, a := range anchors {
			w, n, r := what, "", thousands(rate)
			if i > 0 {
				w, r = "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t\n", w, n, r, a.Anchor, thousands(a.Rate), a.Ratio)
		}
	}
	rows("node pipeline, bare (nobody reading)", r.BareRate, append(slices.Clip(r.BareAnchors), r.BareFloor))
	rows("node pipeline, watched (subscriber, bus, replay)", r.NodeRate, r.Anchors)
	fmt.Fprintf(tw, "Kaimon bus, stream to ZeroMQ subscriber\t%s\t%s\tzmq4 PUB/SUB\t%s\t%.2f\t\n", thousands(float64(r.BusEvents)), thousands(r.BusRate), thousands(r.RawZMQRate), r.BusRatio)
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "latency from the stand-in's stdout line\tsamples\tp50 ms\tp99 ms\tmax ms\t")
	row := func(name string, l bench.Latency) {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\n", name, l.Samples, l.P50, l.P99, l.Max)
	}
	floor := func(l bench.Latency) {
		// As fast as they can print, the CLIs wait behind different
		// amounts (the node's outbox holds them past 4 MiB of events, the
		// floor's publisher past 1,024 lines): paced, the two compare.
		if l.Samples > 0 && r.Rate > 0 {
			row("    the floor: the lines straight to JetStream", l)
		}
	}
	row("(a) stored in the stream, bare rounds", r.StoredBare)
	floor(r.FloorStoredBare)
	row("(a) stored in the stream, watched rounds", r.Stored)
	floor(r.FloorStored)
	row("(b) core subscriber of agent.<id>", r.Core)
	row("(c) Kaimon bus to a ZeroMQ subscriber", r.Bus)
	floor(r.FloorBus)
	row("(d) following replay", r.Replay)
	row("agent open", r.Open)
	tw.Flush()
	if r.Rate > 0 {
		fmt.Fprintf(w, "p99 over the floor's (the same stand-ins, each line published straight to JetStream): stored bare %s, stored watched %s, bus %s\n",
			over(r.StoredBare, r.FloorStoredBare), over(r.Stored, r.FloorStored), over(r.Bus, r.FloorBus))
	}
	fmt.Fprintln(w)
	if r.NodeRSSOpen > 0 {
		fmt.Fprintf(w, "node resident memory: %s MB before the opens, %s MB with %d agents open (%s KB per agent), %s MB after the turns\n",
			mb(r.NodeRSSBefore), mb(r.NodeRSSOpen), r.Agents, thousands(r.NodeRSSPerAgent/1024), mb(r.NodeRSSAfter))
	}
	if fl := r.Fleet; fl != nil {
		hb := fl.Heartbeat
		fmt.Fprintf(w, "fleet: %d fake nodes registered, each beating every %s (records live %s)\n",
			fl.NodesRegistered, time.Duration(fl.HeartbeatInterval*float64(time.Millisecond)), time.Duration(fl.NodeTTL*float64(time.Millisecond)))
		fmt.Fprintf(w, "  heartbeat load on the server over %.0fs: %.1f records/s stored, %s B/s in, %s B/s of acknowledgements; each watcher of the nodes bucket gets %.1f msgs/s, %s B/s\n",
			hb.Window, hb.MsgsPerSec, thousands(hb.BytesInPerSec), thousands(hb.BytesOutPerSec), hb.WatchMsgsPerSec, thousands(hb.WatchBytesPerSec))
		fmt.Fprintf(w, "  placement of %d opens naming no node: p50 %.2f ms, p99 %.2f ms, max %.2f ms; %d of %d nodes took some, %d to %d each\n\n",
			fl.Opens, fl.Placement.P50, fl.Placement.P99, fl.Placement.Max, fl.NodesUsed, fl.NodesRegistered, fl.MinOpensPerNode, fl.MaxOpensPerNode)
	}
	v := r.Verified
	fmt.Fprintf(w, "verified: %d of %d agents' streams gapless, %d of %d turns ended, %s deltas stored as printed\n",
		v.Gapless, r.Agents, v.TurnsEnded, v.TurnsExpected, thousands(float64(v.Deltas)))
	for _, p := range v.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
}

// over is l's p99 over the floor's, or "-" with no floor.
func over(l, floor bench.Latency) string {
	if floor.P99 <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", l.P99/floor.P99)
}

func mb(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// thousands formats v rounded, with commas.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
