package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// The commands of agents on a repository (open --repo): their work
// against their start, and their work brought back as a branch.

// noObjectStore is why scoped credentials cannot do the repository
// commands but diff yet.
const noObjectStore = "scoped credentials do not reach the repositories' object store"

// A differ asks for an agent's diff: the coordinator's client asks the
// node, a scoped one the coordinator's fabric service.
type differ interface {
	Diff(ctx context.Context, id string, stat bool) (schemas.DiffReply, error)
}

var _ = []differ{(*client.Direct)(nil), (*client.Remote)(nil)}

// direct is the fabric as a client with the coordinator's rights, which
// the repository commands need; why says what scoped credentials lack.
func (v *verb) direct(why string) (*client.Direct, error) {
	f, err := v.fabric()
	if err != nil {
		return nil, err
	}
	d, ok := f.(*client.Direct)
	if !ok {
		return nil, schemas.Errf(schemas.CodeForbidden, "this needs the coordinator's credentials for now: %s", why)
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
				f, err := v.fabric()
				if err != nil {
					return err
				}
				d, ok := f.(differ)
				if !ok {
					return schemas.Errf(schemas.CodeInternal, "this client cannot ask for a diff")
				}
				rep, err := d.Diff(ctx, id, stat)
				if err != nil {
					return err
				}
				if v.json {
					return printJSON(v.env, rep)
				}
				// As git prints it for git apply; but on a terminal, what
				// the agent wrote into its files shown as text, as git's
				// pager (less) shows it, not sent to the terminal to act on.
				w := v.out()
				if f, ok := w.(*os.File); ok && isTerminal(f) {
					w = v.text()
				}
				_, err = fmt.Fprint(w, rep.Diff)
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
is not moved, nor one holding commits of yours. A branch holding commits of
the agent's that its work no longer does (it rewrote its history, or its
checkout was lost and it began anew) moves only with --force. Prints the
branch and its commit.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var into string
			var force bool
			fs.StringVar(&into, "into", "", "the repository to fetch into, a `dir` of its work tree (default: the one the agent was opened on)")
			fs.BoolVar(&force, "force", false, "move the branch even past commits of the agent's its work no longer holds (git's reflog keeps where it was)")
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
				d, err := v.direct(noObjectStore)
				if err != nil {
					return err
				}
				got, err := d.Fetch(ctx, id, into, force)
				if err != nil {
					return err
				}
				return v.reply(got, fetchedLine(got)+" in "+got.Into)
			}
		})
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
	return fmt.Sprintf("%s %s (%s, %s changed)", got.Branch, got.Tip, render.Plural(got.Commits, "commit"), render.Plural(got.Files, "file"))
}
