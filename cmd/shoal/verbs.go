package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// verbCommand builds a client command: its own flags, the client flags,
// --json, and a body that talks to the fabric.
func verbCommand(name, args, summary, help string, flags func(fs *flag.FlagSet) func(ctx context.Context, v *verb, args []string) error) *command {
	return &command{
		name: name, args: args, summary: summary, help: help,
		flags: func(fs *flag.FlagSet) runner {
			v := &verb{}
			v.client.register(fs)
			fs.BoolVar(&v.json, "json", false, "print the reply as JSON")
			body := flags(fs)
			return func(ctx context.Context, env *environment, args []string) error {
				v.env = env
				defer v.close()
				return body(ctx, v, args)
			}
		},
	}
}

type verb struct {
	client clientOptions
	json   bool
	env    *environment
	f      client.Client
	closer func()
}

// fabric connects on first use; the command closes the connection when it
// ends, so arguments are checked before anything is dialled.
func (v *verb) fabric() (client.Client, error) {
	if v.f == nil {
		f, closer, err := v.client.fabric(v.env)
		if err != nil {
			return nil, err
		}
		v.f, v.closer = f, closer
	}
	return v.f, nil
}

func (v *verb) close() {
	if v.closer != nil {
		v.closer()
	}
}

// reply prints rep as JSON with --json, else the line.
func (v *verb) reply(rep any, line string) error {
	if v.json {
		return printJSON(v.env, rep)
	}
	_, err := fmt.Fprintln(v.text(), line)
	return err
}

func (v *verb) out() io.Writer { return v.env.io.out }

// text is the verb's output for what agents, models and nodes wrote: its
// escape sequences and control characters removed (render.Clean), so
// none reaches the terminal. --json prints them escaped, as JSON does.
func (v *verb) text() io.Writer { return render.CleanWriter(v.env.io.out) }

// agentArg checks the agent id argument.
func agentArg(args []string, want string) (string, []string, error) {
	if len(args) == 0 {
		return "", nil, usagef("missing %s", want)
	}
	if err := schemas.ValidID(args[0]); err != nil {
		return "", nil, usagef("agent %v", err)
	}
	return args[0], args[1:], nil
}

// textArg joins the remaining arguments, or reads stdin for "-".
func textArg(env *environment, args []string) (string, error) {
	if len(args) == 0 {
		return "", usagef("missing the text to send (give it as arguments, or - to read stdin)")
	}
	text := strings.Join(args, " ")
	if len(args) == 1 && args[0] == "-" {
		b, err := io.ReadAll(env.io.in)
		if err != nil {
			return "", err
		}
		text = strings.TrimRight(string(b), "\n")
	}
	if strings.TrimSpace(text) == "" {
		return "", usagef("the text to send is empty")
	}
	return text, nil
}

func openCommand() *command {
	return verbCommand("open", "[dir]", "open an agent in a directory, or on a repository",
		`Opens an agent with its working directory at dir (default: the current
directory; a relative path is made absolute here, and must exist on the
node that runs the agent). Prints the agent's id.

With --repo, the agent works on a git repository of this machine instead,
on whichever node it runs: in a checkout of its own on branch shoal/<id>,
starting on --ref (default HEAD) or, with --with-changes, on the
uncommitted work (tracked and untracked files, not ignored ones). Only
the commits the node lacks are sent, through the fabric; this checkout,
its index, stash and HEAD are not touched. `+"`shoal diff`"+` shows the
agent's work, `+"`shoal fetch`"+` brings it back as branch shoal/<id>.

The model selects the backend: acp:<agent>[:<model>], ollama:<tag>,
vmlx:<tag>, anything else runs the claude CLI (a Claude model may carry an
effort suffix, e.g. sonnet/high).`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var req schemas.OpenRequest
			var allowed, disallowed string
			var guardOff bool
			fs.StringVar(&req.Model, "model", schemas.DefaultModel, "`model` alias or id, with an optional backend prefix")
			fs.StringVar(&req.Effort, "effort", "", "claude thinking `effort`: low, medium, high, xhigh or max")
			fs.StringVar(&req.Permission, "permission", "default", "permission `preset`: default, ask, notebook, specialist, lab, auto or bypass")
			fs.BoolVar(&req.Ask, "ask", false, "ask a person (shoal permit, agent_permit) before what the preset neither allows nor denies")
			var askTimeout time.Duration
			durationFlag(fs, &askTimeout, "ask-timeout", 0, "deny a permission request nobody answered within this `duration` (default: the node's, 10m)")
			fs.StringVar(&req.PermissionMode, "permission-mode", "", "override the preset's claude permission `mode`")
			fs.StringVar(&allowed, "allow", "", "comma-separated `tools` the agent may use without asking")
			fs.BoolVar(&req.Only, "only", false, "make --allow the agent's whole tool set")
			fs.StringVar(&disallowed, "disallow", "", "comma-separated `tools` the agent may not use, besides the recursion guard (--allow-nested lifts it)")
			fs.BoolVar(&guardOff, "allow-nested", false, "lift the recursion guard, so the agent may open and drive agents")
			var reach string
			fs.StringVar(&reach, "reach", "own", "what the agent may read and drive through Shoal's tools: `own` (the agents it opened, and theirs), read (and read every agent) or all (read and drive every agent)")
			fs.StringVar(&req.MCPConfig, "mcp-config", "", "an extra MCP config `file` for the agent")
			fs.StringVar(&req.SystemPrompt, "system-prompt", "", "`text` appended to the agent's system prompt")
			fs.StringVar(&req.ID, "id", "", "the agent's `id` (default: 8 random hex characters)")
			fs.StringVar(&req.Node, "node", "", "the `node` to run on (default: placement chooses)")
			fs.Int64Var(&req.BudgetTokens, "budget-tokens", 0, "the most `tokens` the agent's turns may use in all (input, output and cache); a turn past it is refused (0: no limit)")
			fs.Float64Var(&req.BudgetUSD, "budget-usd", 0, "the most `dollars` the agent's turns may cost in all, where its CLI reports a cost (0: no limit)")
			var labelList, sandboxNet string
			fs.StringVar(&labelList, "labels", "", "comma-separated `key=value` labels the node must carry")
			var sandbox optionalBool
			fs.Var(&sandbox, "sandbox", "run the agent in its node's kernel sandbox; --sandbox=false declines it (default: the node's --sandbox mode)")
			fs.StringVar(&sandboxNet, "sandbox-net", "", "comma-separated `hosts` a sandboxed agent may reach besides its model API")
			fs.StringVar(&req.SandboxKind, "sandbox-kind", "", "a sandbox at least this strong, on a node that gives it: `kind` namespaces or landlock (implies --sandbox)")
			var repo client.RepoSource
			fs.StringVar(&repo.Dir, "repo", "", "work on the git repository at `dir` of this machine, in a checkout of the agent's own on its node")
			fs.StringVar(&repo.Ref, "ref", "", "with --repo: the `ref` the agent starts on (default HEAD)")
			fs.BoolVar(&repo.WithChanges, "with-changes", false, "with --repo: start on the uncommitted work, on top of HEAD")
			return func(ctx context.Context, v *verb, args []string) error {
				if repo.Dir == "" && (repo.Ref != "" || repo.WithChanges) {
					return usagef("--ref and --with-changes go with --repo DIR")
				}
				if repo.Dir != "" && len(args) > 0 {
					return usagef("open --repo works on a copy of the repository on the agent's node; it takes no directory (got %s)", args[0])
				}
				if askTimeout < 0 {
					return usagef("--ask-timeout %s: a person needs some time to answer", askTimeout)
				}
				req.AskTimeout = askTimeout.Seconds()
				r, err := schemas.ParseReach(reach)
				if err != nil {
					return usagef("--reach: %v", err)
				}
				if r != schemas.ReachOwn {
					req.Reach = r
				}
				req.Sandbox = sandbox.value
				req.SandboxNet = splitList(sandboxNet)
				if len(args) > 1 {
					return usagef("open takes one directory, got %d arguments", len(args))
				}
				dir := "."
				if len(args) == 1 {
					dir = args[0]
				}
				abs, err := filepath.Abs(dir)
				if err != nil {
					return err
				}
				req.CWD = abs
				req.AllowedTools = splitList(allowed)
				if labelList != "" {
					if req.Labels, err = parseLabels(labelList); err != nil {
						return err
					}
				}
				if disallowed != "" || guardOff {
					// --disallow adds to the guard, which only
					// --allow-nested lifts: a person denying one more
					// tool does not mean to let the agent open agents.
					// (Over MCP a disallowed_tools list replaces the
					// guard, as Kaimon's does.)
					d := []string{}
					if !guardOff {
						d = append(d, schemas.RecursionGuard...)
					}
					d = append(d, splitList(disallowed)...)
					req.DisallowedTools = &d
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				var rep schemas.OpenReply
				if repo.Dir != "" {
					d, ok := f.(*client.Direct)
					switch {
					case !ok && v.client.who != nil && v.client.who.Role == broker.RoleObserver:
						return schemas.Errf(schemas.CodeForbidden, "these credentials may only observe: an open needs client credentials (shoal creds client NAME), and one on a repository the coordinator's")
					case !ok:
						return schemas.Errf(schemas.CodeForbidden, "an open on a repository needs the coordinator's credentials for now: %s", noObjectStore)
					}
					rep, err = d.OpenRepo(ctx, req, repo)
				} else {
					rep, err = f.Open(ctx, req)
				}
				if err != nil {
					return err
				}
				return v.reply(rep, rep.AgentID)
			}
		})
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func sendCommand() *command {
	return verbCommand("send", "<agent> <text…|->", "send an agent a turn; prints the turn number",
		"Writes a user turn to the agent and returns at once with the turn's number;\nwatch it with `shoal tail`, read it with `shoal output`.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				text, err := textArg(v.env, rest)
				if err != nil {
					return err
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rep, err := f.Send(ctx, schemas.SendRequest{AgentID: id, Text: text})
				if err != nil {
					return whyDead(ctx, f, id, err)
				}
				return v.reply(rep, strconv.Itoa(rep.Turn))
			}
		})
}

// whyDead adds to Kaimon's "agent '<id>' is dead" (its words, which the
// MCP tools keep) where the agent's life ended and why, as its stream
// says (lastError: a CLI that exited, a node restarted or lost), and what
// a person can do. Any other error is err.
func whyDead(ctx context.Context, f client.Client, id string, err error) error {
	if schemas.CodeOf(err) != schemas.CodeUnavailable || err.Error() != fmt.Sprintf("agent '%s' is dead", id) {
		return err
	}
	rec, rerr := f.Status(ctx, id)
	if rerr != nil || rec.Status != schemas.StatusDead {
		return err
	}
	how := fmt.Sprintf("its life on node %s ended", rec.Node)
	if rec.ClosedBy == schemas.CloserName {
		how = fmt.Sprintf("the coordinator closed it when node %s was lost", rec.Node)
	}
	if said := lastError(ctx, f, id, rec.LastEvent); said != "" {
		how += ": " + said
	}
	return schemas.Errf(schemas.CodeUnavailable, "%v: %s; shoal output %s shows how its last turn went, and shoal open --id %s <dir> starts a new life of it", err, how, id, id)
}

// lastError is why an agent's life ended, as its last events up to event
// last say it, "" when they say nothing or cannot be read: what its CLI
// said as it exited (an error carrying its stderr) before anything else;
// else the last error that is not a turn's own ending ("turn 3 was
// stopped: …", "… during turn 3", which follow what ended the agent);
// else the last error.
func lastError(ctx context.Context, f client.Client, id string, last uint64) string {
	const within = 32 // events before the last: a death's error comes just before its status
	from := uint64(1)
	if last > within {
		from = last - within
	}
	rep, err := f.Events(ctx, schemas.EventsRequest{AgentID: id, FromEvent: from, Max: 2 * within})
	if err != nil {
		return ""
	}
	var exited, agent, turn string
	for _, e := range rep.Events {
		ev, err := schemas.Decode(e.Event)
		if err != nil {
			continue
		}
		p, ok := ev.Payload.(schemas.Error)
		if !ok {
			continue
		}
		var data struct {
			Stderr *string `json:"stderr"`
		}
		switch {
		case json.Unmarshal(p.Data, &data) == nil && data.Stderr != nil:
			exited = p.Message
		case strings.HasPrefix(p.Message, fmt.Sprintf("turn %d ", ev.Turn)), strings.HasSuffix(p.Message, fmt.Sprintf(" during turn %d", ev.Turn)):
			turn = p.Message
		default:
			agent = p.Message
		}
	}
	return cmp.Or(exited, agent, turn)
}

func runCommand() *command {
	return verbCommand("run", "<agent> <text…|->", "send an agent a turn and wait for its answer",
		"Sends a turn and waits until it ends, then prints the assistant's text.\nOne synchronous run per agent at a time.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var wait time.Duration
			durationFlag(fs, &wait, "wait", schemas.DefaultRunTimeout, "give up waiting for the turn to end after this `duration` (--timeout bounds each answer of the fabric, not the turn)")
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				text, err := textArg(v.env, rest)
				if err != nil {
					return err
				}
				if wait <= 0 {
					return usagef("--wait %s: a run waits for more than no time; give a duration such as 10m", wait)
				}
				if wait > schemas.MaxRunTimeout {
					return usagef("--wait %s: a run waits at most %s", wait, schemas.MaxRunTimeout)
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				stopTelling := v.tellAsks(ctx, f, id)
				rep, err := f.Run(ctx, schemas.RunRequest{AgentID: id, Text: text, Timeout: wait.Seconds()})
				stopTelling()
				if err != nil {
					return stopped(ctx, whyDead(ctx, f, id, err), fmt.Sprintf("stopped waiting: agent %s's turn goes on (shoal interrupt %s stops it; shoal output %s reads it)", id, id, id))
				}
				if err := v.reply(rep, rep.Text); err != nil {
					return err
				}
				if rep.StopReason == schemas.StopCancelled {
					// Why, when the turn says (a budget it crossed): an
					// interrupt of a person's says nothing.
					c := &cancelledError{turn: rep.Turn, notBegun: rep.NotBegun}
					if err := client.TurnError(ctx, f, id, rep.Turn); errors.Is(err, client.ErrTurnFailed) {
						c.why = strings.TrimPrefix(err.Error(), client.ErrTurnFailed.Error()+": ")
					}
					return c
				}
				// A turn that failed (the model refused it, the CLI
				// failed) printed what it said; the exit says it failed.
				if err := client.TurnError(ctx, f, id, rep.Turn); errors.Is(err, client.ErrTurnFailed) {
					why := strings.TrimPrefix(err.Error(), client.ErrTurnFailed.Error()+": ")
					// (A node before 2026-12-07 said "was interrupted".)
					if strings.HasPrefix(why, fmt.Sprintf("turn %d passed its budget: ", rep.Turn)) || strings.HasPrefix(why, fmt.Sprintf("turn %d was interrupted: ", rep.Turn)) {
						// Its budget's interrupt (the node's words) came
						// as it ended on its own: a budget crossed is
						// exit 7 whichever came first.
						return &cancelledError{turn: rep.Turn, why: why, ended: true}
					}
					return err
				}
				return nil
			}
		})
}

// tellAsks says on stderr, until the returned func is called, each
// permission request agent id makes from now on: a run waiting on a
// person printed nothing for as long as nobody answered (ten minutes by
// default). Nothing is said when the agent's stream cannot be followed.
func (v *verb) tellAsks(ctx context.Context, f client.Client, id string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Replay(ctx, []string{id}, client.From{Time: time.Now()}, true, func(r client.Replayed, _ *client.Gap) error {
			m, ok := momentOf(r)
			if !ok || m.Kind != momentPermission || r.Stray != "" {
				return nil
			}
			fmt.Fprintf(v.env.io.err, "shoal: turn %d waits for a person to answer %s %s: shoal permit %s %s allow|deny\n",
				m.Turn, oneLine(m.Tool), oneLine(m.Detail), m.Agent, m.Request)
			return nil
		})
	}()
	return func() { cancel(); <-done }
}

func outputCommand() *command {
	return verbCommand("output", "<agent>", "print an agent's output without waiting",
		"Prints a turn's output (default: the latest turn's last message); a turn\nstill running shows its text so far.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var req schemas.OutputRequest
			var turn, maxChars int
			fs.IntVar(&turn, "turn", -1, "the `turn` to read (default: the latest)")
			fs.StringVar(&req.Which, "which", "last_message", "what to print, a `part`: last_message, full_turn or all")
			fs.BoolVar(&req.IncludeTools, "tools", false, "include a line per tool call and result")
			fs.IntVar(&maxChars, "max-chars", schemas.DefaultMaxChars, "print at most this many `characters`")
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				if len(rest) > 0 {
					return usagef("unexpected argument %q", rest[0])
				}
				req.AgentID = id
				switch {
				case turn >= 0:
					req.Turn = &turn
				case turn != -1:
					return usagef("--turn %d: name a turn by its number (shoal status shows the latest), or leave --turn out for the latest", turn)
				}
				req.MaxChars = &maxChars
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rep, err := f.Output(ctx, req)
				if err != nil {
					return err
				}
				if v.json {
					return printJSON(v.env, rep)
				}
				fmt.Fprintln(v.text(), rep.Text)
				if rep.Truncated {
					fmt.Fprintf(v.env.io.err, "shoal: %d more characters not shown (--max-chars)\n", rep.DroppedChars)
				}
				return nil
			}
		})
}

func statusCommand() *command {
	return verbCommand("status", "<agent>", "show an agent's status",
		"Prints the agent's status record as JSON: status, model, cwd, turn, usage,\nlogs, and the node it runs on.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				if len(rest) > 0 {
					return usagef("unexpected argument %q", rest[0])
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rec, err := f.Status(ctx, id)
				if err != nil {
					return err
				}
				return printJSON(v.env, rec)
			}
		})
}

func lsCommand() *command {
	return verbCommand("ls", "", "list the agents of the fabric",
		"Lists every agent the fabric knows, dead ones kept for review included,\noldest first, with the node each runs on; an agent on a repository shows\nthe repository, its branch and the commit it started from.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				f, err := v.fabric()
				if err != nil {
					return err
				}
				recs, err := f.List(ctx)
				if err != nil {
					return err
				}
				if v.json {
					return printJSON(v.env, schemas.ListReply{Agents: recs})
				}
				if len(recs) == 0 {
					fmt.Fprintln(v.out(), "No agents. Open one with `shoal open`.")
					return nil
				}
				tw := tabwriter.NewWriter(v.text(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNODE\tSTATUS\tMODEL\tTURN\tTOKENS\tCWD")
				for _, r := range recs {
					where := r.CWD
					if ws := r.Workspace; ws != nil {
						// On a repository: the caller's, and the agent's
						// branch of it from its base.
						where = fmt.Sprintf("%s (%s from %.12s)", ws.Source, ws.Branch, ws.Base)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d in / %d out\t%s\n", r.ID, render.Cell(r.Node), render.Cell(string(r.Status)), render.Cell(r.Model), r.Turn,
						r.Usage.InputTokens, r.Usage.OutputTokens, render.Cell(where))
				}
				return tw.Flush()
			}
		})
}

func interruptCommand() *command {
	return verbCommand("interrupt", "<agent>", "cancel an agent's running turn",
		"Cancels the agent's running turn; the turn ends with stop reason cancelled.\nPrints whether a turn was interrupted.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				if len(rest) > 0 {
					return usagef("unexpected argument %q: shoal interrupt takes one agent", rest[0])
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rep, err := f.Interrupt(ctx, schemas.AgentRequest{AgentID: id})
				if err != nil {
					return err
				}
				line := "no turn was running"
				if rep.Interrupted {
					line = "interrupted"
				}
				return v.reply(rep, line)
			}
		})
}

func setModelCommand() *command {
	return verbCommand("set-model", "<agent> <model>", "switch an agent's model, keeping its conversation",
		`Switches a live agent to another model for its next turns, where its
backend can do it in place: ACP agents (session/set_model) and local
models (the next round asks the new model). The model may carry the
backend's prefix (acp:opencode:anthropic/claude-sonnet-5, ollama:qwen3:8b).
Prints whether the agent switched; a claude CLI agent does not (open a new
one with --model).`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				if len(rest) != 1 || strings.TrimSpace(rest[0]) == "" {
					return usagef("give the agent id and one model")
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rep, err := f.SetModel(ctx, schemas.SetModelRequest{AgentID: id, Model: rest[0]})
				if err != nil {
					return err
				}
				if !rep.Switched {
					if v.json {
						if err := v.reply(rep, ""); err != nil {
							return err
						}
					}
					if _, err := f.Status(ctx, id); schemas.CodeOf(err) == schemas.CodeNotFound {
						return schemas.Errf(schemas.CodeNotFound, "not switched: %s", rep.Reason)
					}
					return fmt.Errorf("not switched: %s", rep.Reason)
				}
				return v.reply(rep, "switched to "+rest[0])
			}
		})
}

func closeCommand() *command {
	return verbCommand("close", "<agent>", "close an agent",
		"Stops the agent and everything it started; it is kept as dead for review.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				if len(rest) > 0 {
					return usagef("unexpected argument %q: shoal close takes one agent", rest[0])
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rep, err := f.Close(ctx, schemas.AgentRequest{AgentID: id})
				if err != nil {
					return err
				}
				if !rep.Closed {
					if v.json {
						if err := v.reply(rep, ""); err != nil {
							return err
						}
					}
					return schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
				}
				return v.reply(rep, "closed")
			}
		})
}

// optionalBool is a boolean flag that can be left unset.
type optionalBool struct{ value *bool }

func (b *optionalBool) String() string {
	if b.value == nil {
		return ""
	}
	return strconv.FormatBool(*b.value)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	b.value = &v
	return nil
}

func (b *optionalBool) IsBoolFlag() bool { return true }
