package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/tui"
	"github.com/shoalfabric/shoal/schemas"
)

func tuiCommand() *command {
	return verbCommand("tui", "", "a live terminal monitor of every agent and node, to act from",
		`Shows every agent of the fabric, live, in a stable order (by node, then
by age): its status (working pulses, and turns amber when it has been
silent for --silent), its tokens, and a marker when it waits on a
permission request; for the selected one its record and its events, one
line each, oldest at the top and newest at the bottom: text, thoughts, a
tool call with its result, turn boundaries, errors, permission requests.
The feed and the transcript follow the newest events unless you scroll up.
It works against a local or remote coordinator, with the same --nats,
--creds and TLS flags as every client command (an observer's credentials
are enough to watch, not to act). When the connection to the coordinator
is lost it says so, reconnects, and resumes the feed after the last event
it showed.

Keys: ↑/↓ select, tab moves to the event feed, enter shows an event in
full, t the agent's whole transcript from the stream (wrapped; PgUp/PgDn
and the mouse scroll, enter expands a tool's result), s sends the agent a
turn, i interrupts its turn (after asking), p answers its permission
requests where the fabric serves them (allow, deny with a message, or
one of the agent's options), m
sets its model, o opens an agent (directory, model, preset), x closes a
live agent (after asking) or dismisses a dead one, / filters, g groups by
node, n shows the nodes (labels, agents against their limit, load,
heartbeat age, each backend's problem), ? lists the keys, q quits.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var silent, poll time.Duration
			durationFlag(fs, &silent, "silent", 30*time.Second, "show a working agent amber after this `duration` without events")
			durationFlag(fs, &poll, "poll", time.Second, "read the agent list again every `duration`")
			return func(ctx context.Context, v *verb, args []string) error {
				if len(args) > 0 {
					return usagef("tui takes no arguments")
				}
				// Before anything is drawn or dialled: without a terminal
				// on both sides there is nothing to draw on.
				in, inOK := v.env.io.in.(*os.File)
				out, outOK := v.env.io.out.(*os.File)
				if !inOK || !outOK || !isTerminal(in) || !isTerminal(out) {
					return usagef("shoal tui needs a terminal on its input and output; use shoal tail or shoal ls to watch without one")
				}
				v.client.persistent = true
				// Credentials no longer taken end the monitor, which says
				// why as it exits: it would watch a connection that never
				// comes back.
				ctx, stop := context.WithCancel(ctx)
				defer stop()
				v.client.onCredsGone = func(error) { stop() }
				f, err := v.fabric()
				if err != nil {
					return err
				}
				if d, ok := f.(*client.Direct); ok {
					// It asks what waits each second: from a watch, not a
					// read of every request kept each time. Without one
					// (the bucket not made yet), each read says why.
					d.WatchPermits(ctx)
				}
				dir, _ := os.Getwd()
				// Observer credentials may only watch: the monitor offers no
				// action rather than have each refused once tried.
				who, err := v.client.credentials()
				if err != nil {
					return err
				}
				observer := who != nil && who.Role == broker.RoleObserver
				err = tui.Run(ctx, fabricSource{f}, tui.Options{Poll: poll, Silent: silent, Dir: dir, Observer: observer}, v.env.io.in, v.env.io.out)
				if gone := v.env.credsGone(); gone != nil {
					return gone
				}
				return err
			}
		})
}

// isTerminal reports whether f is a terminal (not merely a character
// device, as /dev/null is).
func isTerminal(f *os.File) bool { return isatty.IsTerminal(f.Fd()) }

// fabricSource reads the monitor's data and acts through the fabric
// client, so it works with direct access and with scoped credentials
// alike.
type fabricSource struct{ f client.Client }

func (s fabricSource) Agents(ctx context.Context) ([]schemas.AgentRecord, error) {
	return s.f.List(ctx)
}

func (s fabricSource) Nodes(ctx context.Context) ([]schemas.NodeRecord, error) { return s.f.Nodes(ctx) }

// Budgets reads what the fleet spent and its budgets (tui.Spender).
func (s fabricSource) Budgets(ctx context.Context) (schemas.BudgetsReply, error) {
	return s.f.Budgets(ctx)
}

// Follow replays every agent's events from now, or, resuming, from the
// time of the last one seen; the monitor drops what it had already.
func (s fabricSource) Follow(ctx context.Context, from tui.Resume, fn func(tui.Event)) error {
	start := client.From{New: true}
	if !from.Since.IsZero() {
		start = client.From{Time: from.Since}
	}
	return s.f.Replay(ctx, nil, start, true, func(r client.Replayed, gap *client.Gap) error {
		if gap != nil {
			fn(tui.Event{Agent: gap.Agent, Event: schemas.Event{Payload: schemas.Errorf("%v", gap)}})
		}
		if r.Stray != "" && !from.Since.IsZero() && !r.Time.After(from.Since) {
			return nil // told already, before the connection was lost
		}
		fn(shown(r))
		return nil
	})
}

func (s fabricSource) History(ctx context.Context, agent string, max int) ([]tui.Event, error) {
	var evs []tui.Event
	err := s.f.Replay(ctx, []string{agent}, client.From{}, false, func(r client.Replayed, gap *client.Gap) error {
		if gap != nil {
			evs = append(evs, tui.Event{Agent: agent, Event: schemas.Event{Payload: schemas.Errorf("%v", gap)}})
		}
		evs = append(evs, shown(r))
		if len(evs) > 2*max {
			evs = append(evs[:0], evs[len(evs)-max:]...)
		}
		return nil
	})
	if gap, ok := errors.AsType[client.Gap](err); ok {
		// Retention dropped every event of the agent: said, as a hole.
		evs, err = append(evs, tui.Event{Agent: agent, Event: schemas.Event{Payload: schemas.Errorf("%v", gap)}}), nil
	}
	if len(evs) > max {
		evs = evs[len(evs)-max:]
	}
	return evs, err
}

func (s fabricSource) Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	return s.f.Open(ctx, req)
}

func (s fabricSource) Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	return s.f.Send(ctx, req)
}

func (s fabricSource) Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error) {
	return s.f.Interrupt(ctx, req)
}

func (s fabricSource) SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	return s.f.SetModel(ctx, req)
}

func (s fabricSource) Close(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	return s.f.Close(ctx, req)
}

func (s fabricSource) Pending(ctx context.Context) (schemas.PendingReply, error) {
	return s.f.Pending(ctx)
}

// Changed counts the files an agent on a repository changed (its diff's
// stat).
func (s fabricSource) Changed(ctx context.Context, agent string) (int, error) {
	d, ok := s.f.(differ)
	if !ok {
		return 0, errors.New("this client cannot ask for a diff")
	}
	rep, err := d.Diff(ctx, agent, true)
	return rep.Files, err
}

func (s fabricSource) Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
	req.By = "tui"
	return s.f.Permit(ctx, req)
}

// shown is what the monitor shows of a replayed message: the event, or
// an error line saying why it is not shown (a stray, an event that does
// not decode).
func shown(r client.Replayed) tui.Event {
	if r.Stray != "" {
		return tui.Event{Agent: r.Agent, Stored: r.Time, Event: schemas.Event{Payload: schemas.Errorf("%s", strayText(r))}}
	}
	ev, err := r.Event()
	if err != nil {
		ev = schemas.Event{Turn: r.Turn, Payload: schemas.Errorf("event %d of agent %s does not decode: %v", r.N, r.Agent, err)}
	}
	return tui.Event{Agent: r.Agent, N: r.N, Stored: r.Time, Event: ev}
}
