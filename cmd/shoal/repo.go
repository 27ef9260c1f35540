package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// The commands of agents on a repository (open --repo): their work
// against their start, and their work brought back as a branch.

// direct is the fabric as a client with the coordinator's rights, which
// the repository commands need: scoped credentials do not reach the
// repositories' object store yet.
func (v *verb) direct(what string) (*client.Direct, error) {
	f, err := v.fabric()
	if err != nil {
		return nil, err
	}
	d, ok := f.(*client.Direct)
	if !ok {
		return nil, schemas.Errf(schemas.CodeForbidden, "%s needs the coordinator's credentials for now: scoped credentials do not reach the repositories' object store", what)
	}
	return d, nil
}

func diffCommand() *command {
	return verbCommand("diff", "<agent>", "show the work of an agent opened on a repository",
		`Prints what the agent changed against the commit it started on, as git
diff prints it: its commits and what it has not committed, untracked files
included (ignored ones not). With --stat, a summary of the files changed.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var stat bool
			fs.BoolVar(&stat, "stat", false, "a summary of the files changed instead of the diff")
			return func(ctx context.Context, v *verb, args []string) error {
				id, err := oneAgent(args)
				if err != nil {
					return err
				}
				d, err := v.direct("shoal diff")
				if err != nil {
					return err
				}
				rep, err := d.Diff(ctx, id, stat)
				if err != nil {
					return err
				}
				if v.json {
					return printJSON(v.env, rep)
				}
				_, err = fmt.Fprint(v.out(), rep.Diff)
				return err
			}
		})
}

func fetchCommand() *command {
	return verbCommand("fetch", "<agent>", "bring the work of an agent opened on a repository back as a branch",
		`Creates or moves branch shoal/<agent> in the repository the agent was
opened on (or --into DIR) to the agent's work: its commits and, on top, a
commit of what it has not committed, whose message names the agent and its
turn. Your checkout, index and HEAD are not touched; a branch checked out
is not moved. Prints the branch and its commit.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var into string
			fs.StringVar(&into, "into", "", "the repository to fetch into, a `dir` of its work tree (default: the one the agent was opened on)")
			return func(ctx context.Context, v *verb, args []string) error {
				id, err := oneAgent(args)
				if err != nil {
					return err
				}
				if into != "" {
					if into, err = filepath.Abs(into); err != nil {
						return err
					}
				}
				d, err := v.direct("shoal fetch")
				if err != nil {
					return err
				}
				got, err := d.Fetch(ctx, id, into)
				if err != nil {
					return err
				}
				return v.reply(got, fetchedLine(got)+" in "+got.Into)
			}
		})
}

func jobCommand() *command {
	return verbCommand("job", `--repo <dir> <prompt…|->`, "run one prompt on a repository and bring its work back as a branch",
		`Opens an agent on the repository (as open --repo does, on whichever node
placement chooses), runs the prompt as its one turn, brings its work back
as branch shoal/<agent> (as fetch does), closes the agent and prints the
branch and its commit. Exits 0 when the turn ended well; when it failed
(an error, or a stop other than the end of its turn) the work it did is
fetched all the same and the job exits non-zero, saying why.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var req schemas.OpenRequest
			var src client.RepoSource
			var labelList string
			var sandbox optionalBool
			var wait time.Duration
			fs.StringVar(&src.Dir, "repo", "", "the git repository at `dir` of this machine the job works on")
			fs.StringVar(&src.Ref, "ref", "", "the `ref` the job starts on (default HEAD)")
			fs.BoolVar(&src.WithChanges, "with-changes", false, "start on the uncommitted work, on top of HEAD")
			fs.StringVar(&req.Model, "model", schemas.DefaultModel, "`model` alias or id, with an optional backend prefix")
			fs.StringVar(&req.Permission, "permission", "default", "permission `preset`: default, ask, notebook, specialist, lab, auto or bypass")
			fs.StringVar(&req.Node, "node", "", "the `node` to run on (default: placement chooses)")
			fs.StringVar(&labelList, "labels", "", "comma-separated `key=value` labels the node must carry")
			fs.Var(&sandbox, "sandbox", "run the job's agent in its node's kernel sandbox (default: the node's --sandbox mode)")
			durationFlag(fs, &wait, "wait", schemas.DefaultRunTimeout, "give up on the turn after this `duration`")
			return func(ctx context.Context, v *verb, args []string) error {
				if src.Dir == "" {
					return usagef("job needs --repo DIR: the repository it works on")
				}
				if wait <= 0 {
					return usagef("--wait %s: a job's turn needs some time; give a duration such as 30m", wait)
				}
				text, err := textArg(v.env, args)
				if err != nil {
					return err
				}
				req.Sandbox = sandbox.value
				if labelList != "" {
					if req.Labels, err = parseLabels(labelList); err != nil {
						return err
					}
				}
				d, err := v.direct("shoal job")
				if err != nil {
					return err
				}
				opened, err := d.OpenRepo(ctx, req, src)
				if err != nil {
					return err
				}
				id := opened.AgentID
				fmt.Fprintf(v.env.io.err, "shoal: job agent %s on node %s\n", id, opened.Node)
				defer d.Close(context.WithoutCancel(ctx), schemas.AgentRequest{AgentID: id})
				rep, runErr := d.Run(ctx, schemas.RunRequest{AgentID: id, Text: text, Timeout: wait.Seconds()})
				failed := runErr
				if failed == nil {
					failed = turnFailure(ctx, d, id, rep)
				}
				got, err := d.Fetch(ctx, id, "")
				if err != nil {
					if failed != nil {
						return fmt.Errorf("%w; and its work could not be fetched: %v", failed, err)
					}
					return err
				}
				if err := v.reply(got, fetchedLine(got)); err != nil {
					return err
				}
				if failed != nil {
					return fmt.Errorf("job agent %s: %w (its work so far is on %s)", id, failed, got.Branch)
				}
				return nil
			}
		})
}

// turnFailure says why the turn rep answered did not end well: an error
// event in it, or a stop other than the end of its turn; nil when it did.
func turnFailure(ctx context.Context, d *client.Direct, id string, rep schemas.RunReply) error {
	page, err := d.Events(ctx, schemas.EventsRequest{AgentID: id, FromTurn: rep.Turn, Max: 5000})
	if err != nil {
		return fmt.Errorf("the turn's events cannot be read: %w", err)
	}
	for _, se := range page.Events {
		ev, err := schemas.Decode(se.Event)
		if err != nil || ev.Turn != rep.Turn {
			continue
		}
		if e, ok := ev.Payload.(schemas.Error); ok {
			return fmt.Errorf("the turn failed: %s", e.Message)
		}
	}
	if rep.StopReason != "" && rep.StopReason != schemas.StopEndTurn {
		return fmt.Errorf("the turn stopped: %s", rep.StopReason)
	}
	return nil
}

// oneAgent is the agent id of a command that takes it and nothing else.
func oneAgent(args []string) (string, error) {
	id, rest, err := agentArg(args, "the agent id")
	if err == nil && len(rest) > 0 {
		err = usagef("unexpected argument %q", rest[0])
	}
	return id, err
}

// fetchedLine is what fetch and job print of the branch they made.
func fetchedLine(got client.Fetched) string {
	return fmt.Sprintf("%s %s (%d commits, %d files changed)", got.Branch, got.Tip, got.Commits, got.Files)
}
