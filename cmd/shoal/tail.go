package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

func tailCommand() *command {
	return verbCommand("tail", "[agent…]", "watch agents work as they stream",
		`Shows agents working: their text as it streams, a line per tool call and
per result, turn boundaries and usage. With no agent it follows every
agent of the fabric. It replays each agent's history first (--new skips
it), and stops once the agents it follows are dead; Ctrl-C stops it too.
--json prints the raw {kind, turn, data} envelopes, one per line.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var onlyNew, thoughts bool
			fs.BoolVar(&onlyNew, "new", false, "show only events from now on")
			fs.BoolVar(&thoughts, "thoughts", false, "show the agents' reasoning")
			return func(ctx context.Context, v *verb, args []string) error {
				subjects := []string{schemas.EventSubjects}
				if len(args) > 0 {
					subjects = subjects[:0]
					for _, id := range args {
						if err := schemas.ValidID(id); err != nil {
							return usagef("agent %v", err)
						}
						subjects = append(subjects, schemas.EventSubject(id))
					}
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				cfg := jetstream.OrderedConsumerConfig{FilterSubjects: subjects}
				if onlyNew {
					cfg.DeliverPolicy = jetstream.DeliverNewPolicy
				}
				cons, err := f.JetStream().OrderedConsumer(ctx, schemas.StreamName, cfg)
				if err != nil {
					return fmt.Errorf("follow %s: %w", schemas.StreamName, err)
				}
				p := render.New(v.out(), render.Options{
					Color:        !v.json && colorful(v.env),
					ShowThoughts: thoughts,
					Prefix:       len(args) != 1,
				})
				defer p.Flush()
				live := map[string]bool{}
				for {
					msg, err := cons.Next(jetstream.FetchContext(ctx))
					if err != nil {
						if ctx.Err() != nil || errors.Is(err, context.Canceled) {
							return nil
						}
						return err
					}
					id, _ := schemas.AgentFromSubject(msg.Subject())
					if v.json {
						fmt.Fprintf(v.out(), "%s\n", msg.Data())
					} else if ev, err := schemas.Decode(msg.Data()); err != nil {
						fmt.Fprintf(v.out(), "[%s] unreadable event: %v\n", id, err)
					} else {
						p.Event(id, ev)
					}
					if ev, err := schemas.Decode(msg.Data()); err == nil {
						if st, ok := ev.Payload.(schemas.Status); ok && st.Status == schemas.StatusDead {
							live[id] = false
						} else {
							live[id] = true
						}
					}
					meta, err := msg.Metadata()
					if len(args) > 0 && err == nil && meta.NumPending == 0 && allDead(args, live) {
						return nil
					}
				}
			}
		})
}

// allDead reports whether every followed agent's last event was its death.
func allDead(ids []string, live map[string]bool) bool {
	for _, id := range ids {
		if l, seen := live[id]; !seen || l {
			return false
		}
	}
	return true
}

// colorful reports whether stdout is a terminal that wants colour.
func colorful(env *environment) bool {
	if env.getenv("NO_COLOR") != "" || env.getenv("TERM") == "dumb" {
		return false
	}
	f, ok := env.io.out.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
