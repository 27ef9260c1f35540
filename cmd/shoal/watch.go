package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// A moment is when an agent needs a person, or is done: a permission
// request waiting, a turn ended, an agent dead.
type moment struct {
	Agent string `json:"agent_id"`
	// Kind is permission, turn_end or dead.
	Kind    string `json:"kind"`
	Turn    int    `json:"turn"`
	Event   uint64 `json:"event"`
	Time    string `json:"time"`
	Request string `json:"request_id,omitempty"` // a permission request's, for shoal permit
	Tool    string `json:"tool,omitempty"`
	// Detail says the rest in words: the request's input, how the turn
	// ended.
	Detail string `json:"detail,omitempty"`
}

// The moments' kinds.
const (
	momentPermission = "permission"
	momentTurnEnd    = "turn_end"
	momentDead       = "dead"
)

func watchCommand() *command {
	return verbCommand("watch", "[agent…]", "print a line, or run a command, whenever an agent needs you or is done",
		`Follows every agent (or those named) from now and prints one line per
moment a person may want to hear of: a permission request waiting
(shoal permit answers it), a turn ended, an agent dead. --json prints each
as an object. --exec runs a shell command per moment, one at a time in
order, with the moment in its environment: SHOAL_MOMENT (permission,
turn_end or dead), SHOAL_AGENT_ID, SHOAL_TURN, SHOAL_EVENT, SHOAL_REQUEST_ID
and SHOAL_TOOL (a permission request's), SHOAL_DETAIL (the line's words).
A desktop notification is one line of shell:

    shoal watch --exec 'notify-send "shoal: $SHOAL_AGENT_ID" "$SHOAL_MOMENT $SHOAL_DETAIL"'

While the connection is lost it says so and, once back, goes on after the
last event it saw.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var execCmd string
			fs.StringVar(&execCmd, "exec", "", "run this shell `command` once per moment, the moment in its environment")
			return func(ctx context.Context, v *verb, args []string) error {
				for _, id := range args {
					if err := schemas.ValidID(id); err != nil {
						return usagef("agent %v", err)
					}
				}
				v.client.persistent = true // "once back, goes on", however long it was away
				f, err := v.fabric()
				if err != nil {
					return err
				}
				who := "every agent"
				if len(args) > 0 {
					who = strings.Join(args, ", ")
				}
				fmt.Fprintf(v.env.io.err, "shoal: watching %s (Ctrl-C stops)\n", who)
				from := client.From{Time: time.Now()}
				seen := map[string]uint64{}
				for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
					err := f.Replay(ctx, args, from, true, func(r client.Replayed, _ *client.Gap) error {
						wait = time.Second
						if r.Stray != "" || r.N <= seen[r.Agent] {
							return nil
						}
						seen[r.Agent] = r.N
						from.Time = r.Time
						m, ok := momentOf(r)
						if !ok {
							return nil
						}
						return v.tell(ctx, m, execCmd)
					})
					if ctx.Err() != nil {
						return nil
					}
					if c := schemas.CodeOf(err); err != nil && (c == schemas.CodeInvalid || c == schemas.CodeNotFound) {
						return err // no retry mends it
					}
					fmt.Fprintf(v.env.io.err, "shoal: watch: %v; reconnecting in %s\n", err, wait)
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(wait):
					}
				}
			}
		})
}

// momentOf is the moment an event is, if it is one.
func momentOf(r client.Replayed) (moment, bool) {
	if r.Kind != schemas.KindPermission && r.Kind != schemas.KindResult && r.Kind != schemas.KindStatus {
		return moment{}, false
	}
	ev, err := r.Event()
	if err != nil {
		return moment{}, false
	}
	m := moment{Agent: r.Agent, Turn: ev.Turn, Event: r.N, Time: r.Time.UTC().Format(time.RFC3339)}
	switch p := ev.Payload.(type) {
	case schemas.Permission:
		if p.Answer != nil {
			return moment{}, false // the answer, not a request
		}
		m.Kind, m.Request, m.Tool = momentPermission, p.RequestID, p.Tool
		m.Detail = oneLine(schemas.Readable(p.Input, false))
		if len(m.Detail) > 200 {
			m.Detail = m.Detail[:197] + "..."
		}
	case schemas.Result:
		m.Kind, m.Detail = momentTurnEnd, string(p.StopReason)
	case schemas.Status:
		if p.Status != schemas.StatusDead {
			return moment{}, false
		}
		m.Kind = momentDead
	default:
		return moment{}, false
	}
	return m, true
}

// tell prints a moment and runs the command for it.
func (v *verb) tell(ctx context.Context, m moment, execCmd string) error {
	if v.json {
		b, _ := json.Marshal(m)
		fmt.Fprintln(v.out(), schemas.EscapeUnreadable(string(b)))
	} else {
		line := fmt.Sprintf("%s %s %s turn %d", m.Time, m.Agent, m.Kind, m.Turn)
		switch m.Kind {
		case momentPermission:
			line += fmt.Sprintf(": %s %s (shoal permit %s %s allow|deny)", oneLine(m.Tool), oneLine(m.Detail), m.Agent, m.Request)
		case momentTurnEnd:
			line += ": " + oneLine(m.Detail)
		}
		fmt.Fprintln(v.text(), line)
	}
	if execCmd == "" {
		return nil
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", execCmd)
	cmd.Env = append(os.Environ(), "SHOAL_MOMENT="+m.Kind, "SHOAL_AGENT_ID="+m.Agent, "SHOAL_TURN="+strconv.Itoa(m.Turn),
		"SHOAL_EVENT="+strconv.FormatUint(m.Event, 10), "SHOAL_REQUEST_ID="+m.Request, "SHOAL_TOOL="+m.Tool, "SHOAL_DETAIL="+m.Detail)
	cmd.Stdout, cmd.Stderr = v.env.io.err, v.env.io.err
	if err := cmd.Run(); err != nil && ctx.Err() == nil {
		// A failing command is the user's to mend; the watch goes on.
		fmt.Fprintf(v.env.io.err, "shoal: watch: --exec for %s %s: %v\n", m.Agent, m.Kind, err)
	}
	return nil
}
