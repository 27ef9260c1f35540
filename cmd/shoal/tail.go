package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

func tailCommand() *command {
	return verbCommand("tail", "[agent…]", "watch agents work as they stream, from any point",
		`Shows agents working: their text as it streams, a line per tool call and
per result, turn boundaries and usage. With no agent it follows every
agent of the fabric.

--from says where to start: "start" (the default), "new" (only what comes
next), an event number (42), a turn ("turn:3"), a time (RFC 3339, e.g.
2026-11-29T10:00:00Z) or an age ("10m" ago). History is replayed and then
live events follow on the same consumer, with nothing missed or repeated
in between. A gap in an agent's numbering (events past the stream's
retention) is reported. A following tail goes on past an agent's death,
since a dead id may be reopened and its next life's turns are numbered on
from its last; it stops on Ctrl-C, or with --no-follow at the end of what
is stored. An agent the fabric does not know, or a --from past an
agent's end, is an error (exit 3).

--json prints one object per event: the agent's id, the event's number,
its node and the time it was stored, beside the envelope's kind, turn and
data ({"agent_id":"a1","event":42,"node":"n1","time":"…","kind":…}); to
resume, start again with --from <the last event + 1>. --raw prints the
envelopes as stored. --numbers starts each line of the human view with
the number of the event it begins with.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var thoughts, noFollow, raw, numbers bool
			var fromFlag string
			fs.StringVar(&fromFlag, "from", "start", "where to start, a `position`: start, new, an event number, turn:N, a time, or an age like 10m")
			fs.BoolVar(&noFollow, "no-follow", false, "stop at the end of what is stored")
			fs.BoolVar(&thoughts, "thoughts", false, "show the agents' reasoning")
			fs.BoolVar(&raw, "raw", false, "print each envelope as stored, one per line")
			fs.BoolVar(&numbers, "numbers", false, "start each line with its event's number")
			return func(ctx context.Context, v *verb, ids []string) error {
				for _, id := range ids {
					if err := schemas.ValidID(id); err != nil {
						return usagef("agent %v", err)
					}
				}
				from, err := parseFrom(fromFlag, time.Now())
				if err != nil {
					return err
				}
				if (from.Event > 0 || from.Turn > 0) && len(ids) != 1 {
					return usagef("--from %s needs exactly one agent", fromFlag)
				}
				// A following tail outlives an outage of any length, as
				// shoal tui does; it stops on Ctrl-C.
				v.client.persistent = !noFollow
				f, err := v.fabric()
				if err != nil {
					return err
				}
				if raw && v.json {
					return usagef("--raw and --json are two output formats; give one")
				}
				follow := !noFollow
				p := render.New(v.out(), render.Options{
					Color:        !v.json && !raw && colorful(v.env),
					ShowThoughts: thoughts,
					Prefix:       len(ids) != 1,
					Numbers:      numbers,
				})
				defer p.Flush()
				err = f.Replay(ctx, ids, from, follow, func(r client.Replayed, gap *client.Gap) error {
					if r.Stray != "" {
						p.Flush()
						fmt.Fprintf(v.env.io.err, "shoal tail: %s\n", strayText(r))
						return nil
					}
					if gap != nil {
						p.Flush()
						fmt.Fprintf(v.env.io.err, "shoal tail: %s\n", gap.Error())
					}
					ev, err := r.Event()
					switch {
					case raw:
						// The stored envelope, with what JSON leaves as it is but
						// a terminal acts on (C1 controls, bidi overrides) as
						// \u escapes, which mean the same.
						fmt.Fprintf(v.out(), "%s\n", schemas.EscapeUnreadable(string(onLine(r.Raw))))
					case v.json:
						_, err := io.WriteString(v.out(), schemas.EscapeUnreadable(string(jsonLine(r))))
						return err
					case err != nil:
						fmt.Fprintf(v.out(), "[%s] unreadable event %d: %v\n", r.Agent, r.N, err)
					default:
						p.EventNumbered(r.Agent, r.N, ev)
					}
					return nil
				})
				if gap, ok := errors.AsType[client.Gap](err); ok {
					// Nothing left of the agent from there: said as any
					// other hole is, and the read is done.
					p.Flush()
					fmt.Fprintf(v.env.io.err, "shoal tail: %s (retention dropped them; its next event is %d)\n", gap.Error(), gap.To+1)
					return nil
				}
				return err
			}
		})
}

// jsonLine is one event for --json: where it stands (agent, number, node,
// stored time) spliced in front of the envelope's own fields.
func jsonLine(r client.Replayed) []byte {
	head, _ := json.Marshal(struct {
		Agent string `json:"agent_id"`
		N     uint64 `json:"event"`
		Node  string `json:"node,omitempty"`
		Time  string `json:"time"`
	}{r.Agent, r.N, r.Node, r.Time.UTC().Format(time.RFC3339Nano)})
	env := onLine(bytes.TrimSpace(r.Raw))
	if len(env) < 2 || env[0] != '{' {
		// Not an object (a replay only hands over envelopes): carried whole.
		out, _ := json.Marshal(struct {
			Agent string          `json:"agent_id"`
			N     uint64          `json:"event"`
			Raw   json.RawMessage `json:"envelope"`
		}{r.Agent, r.N, json.RawMessage(strconv.Quote(string(env)))})
		return append(out, '\n')
	}
	out := append(head[:len(head)-1:len(head)-1], ',')
	if bytes.Equal(bytes.TrimSpace(env[1:]), []byte("}")) {
		out = out[:len(out)-1]
	}
	out = append(out, env[1:]...)
	return append(out, '\n')
}

// onLine is a stored envelope on one line. JSON may hold line breaks
// between its values, and a node of Shoal's never writes them; one that
// did (a node's credentials in other hands) would make one event print
// as several lines of --json or --raw, one of which could be a whole
// event line of another agent. It is compacted, which means the same; a
// stored message that is not JSON has its line breaks written as \n and
// \r.
func onLine(raw []byte) []byte {
	if !bytes.ContainsAny(raw, "\r\n") {
		return raw
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) == nil {
		return b.Bytes()
	}
	return []byte(strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(string(raw)))
}

// strayText says what a reader skipped: a message on an agent's subject
// that is not one of its events.
func strayText(r client.Replayed) string {
	return fmt.Sprintf("skipped a message on agent:%s that is not one of its events (stream sequence %d): %s", r.Agent, r.Seq, r.Stray)
}

// parseFrom reads --from: start, new, an event number, turn:N, an RFC
// 3339 time, or an age.
func parseFrom(s string, now time.Time) (client.From, error) {
	switch s = strings.TrimSpace(s); {
	case s == "" || s == "start":
		return client.From{}, nil
	case s == "new" || s == "now":
		return client.From{New: true}, nil
	case strings.HasPrefix(s, "turn:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "turn:"))
		if err != nil || n < 1 {
			return client.From{}, usagef("--from %q: a turn is turn:N with N from 1", s)
		}
		return client.From{Turn: n}, nil
	}
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		if n == 0 {
			return client.From{}, usagef("--from 0: event numbers start at 1")
		}
		return client.From{Event: n}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return client.From{Time: t}, nil
	}
	var d time.Duration
	if err := (durationValue{&d}).Set(s); err == nil && d > 0 {
		return client.From{Time: now.Add(-d)}, nil
	}
	return client.From{}, usagef("--from %q is not start, new, an event number, turn:N, a time or an age", s)
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
