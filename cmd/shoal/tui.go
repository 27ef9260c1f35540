package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/tui"
	"github.com/shoalfabric/shoal/schemas"
)

func tuiCommand() *command {
	return verbCommand("tui", "", "a live terminal monitor of every agent and node",
		`Shows every agent of the fabric, live: its status (working pulses, and
turns amber when it has been silent for --silent), grouped by node, and for
the selected one its record and its events, newest first, one line each:
text, thoughts, a tool call with its result, turn boundaries, errors,
permission requests. It works against a local or remote coordinator, with
the same --nats, --creds and TLS flags as every client command (an
observer's credentials are enough to watch).

Keys: ↑/↓ select, tab moves to the event feed, enter shows an event in
full, t the agent's whole transcript from the stream, x closes a live agent
(after asking) or dismisses a dead one, / filters, g groups by node, n
shows the nodes, ? lists the keys, q quits. The mouse selects and scrolls.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var silent, poll time.Duration
			durationFlag(fs, &silent, "silent", 30*time.Second, "show a working agent amber after this `duration` without events")
			durationFlag(fs, &poll, "poll", time.Second, "read the agent list again every `duration`")
			return func(ctx context.Context, v *verb, args []string) error {
				if len(args) > 0 {
					return usagef("tui takes no arguments")
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				if in, ok := v.env.io.in.(*os.File); !ok || !isTerminal(in) {
					return errors.New("shoal tui needs a terminal; use shoal tail or shoal ls to watch without one")
				}
				return tui.Run(ctx, fabricSource{f}, tui.Options{Poll: poll, Silent: silent}, v.env.io.in, v.env.io.out)
			}
		})
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// fabricSource reads the monitor's data through the fabric client, so it
// works with direct access and with scoped credentials alike.
type fabricSource struct{ f client.Client }

func (s fabricSource) Agents(ctx context.Context) ([]schemas.AgentRecord, error) {
	return s.f.List(ctx)
}

func (s fabricSource) Nodes(ctx context.Context) ([]schemas.NodeRecord, error) { return s.f.Nodes(ctx) }

func (s fabricSource) Follow(ctx context.Context, fn func(string, schemas.Event)) error {
	return s.f.Replay(ctx, nil, client.From{New: true}, true, func(r client.Replayed, _ *client.Gap) error {
		if ev, ok := shown(r); ok {
			fn(r.Agent, ev)
		}
		return nil
	})
}

func (s fabricSource) History(ctx context.Context, agent string, max int) ([]schemas.Event, error) {
	var evs []schemas.Event
	err := s.f.Replay(ctx, []string{agent}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		if ev, ok := shown(r); ok {
			evs = append(evs, ev)
			if len(evs) > 2*max {
				evs = append(evs[:0], evs[len(evs)-max:]...)
			}
		}
		return nil
	})
	if len(evs) > max {
		evs = evs[len(evs)-max:]
	}
	return evs, err
}

func (s fabricSource) Close(ctx context.Context, agent string) error {
	_, err := s.f.Close(ctx, schemas.AgentRequest{AgentID: agent})
	return err
}

// shown is what the monitor shows of a replayed message: the event, or,
// for a stray, an error line saying it was skipped.
func shown(r client.Replayed) (schemas.Event, bool) {
	if r.Stray != "" {
		return schemas.Event{Payload: schemas.Errorf("%s", strayText(r))}, true
	}
	ev, err := r.Event()
	return ev, err == nil
}
