package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// Exit codes. A control error's code has its own, so a script can tell a
// missing agent from a gone node or a slow one.
const (
	exitOK          = 0
	exitError       = 1 // the command failed
	exitUsage       = 2 // the command line, configuration or request is wrong, or the rights rules refuse it
	exitNotFound    = 3 // no such agent or node
	exitUnavailable = 4 // the fabric unreachable, the agent dead, its node gone, or nothing can take it
	exitTimeout     = 5 // the operation did not finish in time
	exitConflict    = 6 // the id is taken, a run is already in flight, or a node's name or dir is a running node's
	exitCancelled   = 7 // the turn a run waited for was interrupted
	// exitInterrupted is the status of a command stopped by Ctrl-C or
	// SIGTERM while it waited (or at once by a second one), as a shell
	// reports one ended by SIGINT.
	exitInterrupted = 130
)

// exitFor is the exit code of a command that failed with err.
func exitFor(err error) int {
	if e, ok := errors.AsType[*exitStatusError](err); ok {
		return e.code
	}
	if _, ok := errors.AsType[*usageError](err); ok {
		return exitUsage
	}
	if _, ok := errors.AsType[*cancelledError](err); ok {
		return exitCancelled
	}
	if _, ok := errors.AsType[*stoppedError](err); ok {
		return exitInterrupted
	}
	switch schemas.CodeOf(err) {
	case schemas.CodeInvalid, schemas.CodeForbidden:
		return exitUsage
	case schemas.CodeNotFound:
		return exitNotFound
	case schemas.CodeUnavailable:
		return exitUnavailable
	case schemas.CodeTimeout:
		return exitTimeout
	case schemas.CodeConflict:
		return exitConflict
	}
	return exitError
}

type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// command is one verb of the shoal binary.
type command struct {
	name    string
	args    string // the positional arguments, for the usage line
	summary string // one line, for `shoal help`
	help    string // paragraphs, for `shoal <name> --help`
	// flags registers the command's flags on fs, writing into the
	// returned runner's state; groups.go sorts them into topics and says
	// which are settings.
	flags func(fs *flag.FlagSet) runner
	// direct, when set, runs the command on its unparsed arguments
	// instead (shoal config parses another command's flags).
	direct runner
}

// runner runs a parsed command.
type runner func(ctx context.Context, env *environment, args []string) error

// environment is what every command gets besides its flags.
type environment struct {
	io     stdio
	getenv func(string) string
	// log is a daemon's logger, once it has one: what goes wrong on the
	// way is logged there rather than printed.
	log *slog.Logger
	// logJSON is set with --log-format json: the command's failure is
	// then a log record too, so every line on stderr is JSON.
	logJSON bool
	// dialed are the options the command connected to the fabric with,
	// and gone what the server's word on that connection made of its
	// credentials (clientOptions.credsGone), once it said so: a command
	// that fails once they are gone says that is why.
	dialed atomic.Pointer[clientOptions]
	gone   atomic.Pointer[error]
}

// credsGone is why the command's credentials are no longer taken, nil
// while they are: what the server said, or their expiry passed.
func (e *environment) credsGone() error {
	if gone := e.gone.Load(); gone != nil {
		return *gone
	}
	if o := e.dialed.Load(); o != nil {
		return o.credsExpired()
	}
	return nil
}

// warn reports a problem that does not stop the command: on the
// daemon's logger, else as a line on stderr.
func (e *environment) warn(msg string, err error) {
	if e.log != nil {
		e.log.Warn(msg, "err", err)
		return
	}
	fmt.Fprintf(e.io.err, "shoal: %s: %s\n", msg, oneLine(fmt.Sprint(err)))
}

func commands() []*command {
	return []*command{
		upCommand(), nodeCommand(), credsCommand(),
		openCommand(), sendCommand(), runCommand(), outputCommand(), statusCommand(), diffCommand(), fetchCommand(), jobCommand(),
		lsCommand(), nodesCommand(), interruptCommand(), setModelCommand(), closeCommand(), permitCommand(), pendingCommand(),
		tailCommand(), watchCommand(), usageCommand(), budgetCommand(), tuiCommand(), mcpCommand(),
		benchCommand(), configCommand(), completionCommand(), versionCommand(),
	}
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// exitStatusError is the failure of a shoal process this one ran for
// the same command (a detached job's), which exits as that one did.
type exitStatusError struct {
	code int
	msg  string
}

func (e *exitStatusError) Error() string { return e.msg }

// usageError is a mistake on the command line or in configuration.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// cancelledError is a run whose turn was interrupted: its text so far is
// printed, and the command exits with its own status.
type cancelledError struct {
	turn     int
	notBegun string // why a held turn never began
	why      string // the turn's error event, when it has one (a budget crossed, a timeout)
	// ended says the turn ended on its own as its budget's interrupt
	// came: its text is whole, and the budget is passed all the same.
	ended bool
}

func (e *cancelledError) Error() string {
	switch {
	case e.ended:
		return fmt.Sprintf("%s (turn %d ended on its own as it was being interrupted: its text is whole)", e.why, e.turn)
	case e.notBegun != "":
		return fmt.Sprintf("turn %d never began: %s (stop reason cancelled)", e.turn, e.notBegun)
	case e.why != "":
		return fmt.Sprintf("turn %d was cancelled: %s", e.turn, e.why)
	}
	return fmt.Sprintf("turn %d was interrupted before it ended (stop reason cancelled)", e.turn)
}

// stoppedError is a command the person stopped (Ctrl-C, SIGTERM) while
// it waited on the fabric: what it asked for may go on there, which what
// says.
type stoppedError struct{ what string }

func (e *stoppedError) Error() string { return e.what }

// stopped is err as the person's stop says it, when ctx ended (a signal)
// and err is that ending; what is what the stop leaves ("" for nothing
// to say).
func stopped(ctx context.Context, err error, what string) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if _, ok := errors.AsType[*stoppedError](err); ok {
		return err
	}
	if what == "" {
		what = "stopped by a signal before it finished"
		if !errors.Is(err, context.Canceled) {
			// What failed as the signal came, in words that did not
			// keep the cancellation (a git the signal killed).
			what += " (" + err.Error() + ")"
		}
	}
	return &stoppedError{what}
}

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, io stdio, getenv func(string) string) int {
	env := &environment{io: io, getenv: getenv}
	if len(args) == 0 {
		printOverview(io.err)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c := findCommand(args[1]); c != nil {
				printCommandHelp(io.out, c)
				return exitOK
			}
			fmt.Fprintf(io.err, "shoal: unknown command %q%s (see shoal help)\n", args[1], suggestCommand(args[1]))
			return exitUsage
		}
		printOverview(io.out)
		return exitOK
	case "-v", "-version", "--version":
		name = "version"
	}
	c := findCommand(name)
	if c == nil && strings.HasPrefix(name, "-") {
		fmt.Fprintf(io.err, "shoal: %s before a command: flags follow the command they are for (shoal <command> %s …; see shoal help)\n", name, name)
		return exitUsage
	}
	if c == nil {
		fmt.Fprintf(io.err, "shoal: unknown command %q%s (see shoal help)\n", name, suggestCommand(name))
		return exitUsage
	}
	err := stopped(ctx, c.execute(ctx, env, args[1:]), "")
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		printCommandHelp(io.out, c)
		return exitOK
	}
	if gone := env.credsGone(); gone != nil && !errors.Is(err, gone) {
		if _, ok := errors.AsType[*stoppedError](err); !ok {
			err = fmt.Errorf("%w (%v)", gone, err)
		}
	}
	if u, ok := errors.AsType[*usageError](err); ok && strings.HasPrefix(u.Error(), "unexpected argument") && !strings.Contains(u.Error(), "--help") {
		err = usagef("%s (see shoal %s --help)", u.Error(), c.name)
	}
	msg := fmt.Sprintf("shoal %s: %s", c.name, oneLine(err.Error()))
	if env.logJSON && env.log != nil {
		env.log.Error(msg)
	} else {
		fmt.Fprintln(io.err, msg)
	}
	return exitFor(err)
}

// execute parses the command's flags over its configuration and runs it.
func (c *command) execute(ctx context.Context, env *environment, args []string) error {
	if c.direct != nil {
		return c.direct(ctx, env, args)
	}
	fs, configPath, r := c.flagSet()
	l, err := c.parseSettings(fs, args, configPath, env.getenv)
	if err != nil {
		return err
	}
	if c.args == "" && len(l.positional) > 0 {
		return usagef("unexpected argument %q (see shoal %s --help)", l.positional[0], c.name)
	}
	return r(ctx, env, l.positional)
}

// flagSet registers the command's flags, --config first, on a new set.
func (c *command) flagSet() (*flag.FlagSet, *string, runner) {
	fs := flag.NewFlagSet("shoal "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "read settings from this TOML `file` (default: $SHOAL_CONFIG, then $XDG_CONFIG_HOME/shoal/config.toml if it exists)")
	return fs, configPath, c.flags(fs)
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, `shoal runs headless AI coding agents on whichever machines have them and
streams their events over NATS JetStream.

Usage: shoal <command> [flags] [arguments]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Settings (where the NATS is, how up and node run, logging) can also be set
in the config file under the flag's name, or in the environment as
SHOAL_<NAME> (upper case, '-' as '_'); flags win over the environment,
which wins over the file. A command's help marks its settings with their
environment variable; its other flags (an agent's id, --json, --timeout)
come from the command line only. shoal config shows each setting's value
and where it came from. Flags may come before or after the arguments;
"--" ends them, for an argument that starts with a dash.

Exit status: 0 success, 1 failure, 2 a wrong command line, configuration
or request, 3 no such agent or node, 4 unavailable (the fabric cannot be
reached, the agent is dead, its node gone, or no node can take it), 5
timed out, 6 conflict (the id is
taken, a run is already in flight, a permission request already
answered, a node's name or directory in use), 7 a run whose turn was interrupted,
130 stopped by Ctrl-C or SIGTERM while it waited.

Run 'shoal help <command>' or 'shoal <command> --help' for details.
`)
}

func oneLine(s string) string {
	// An error may quote what a node or a model said: no escape sequence
	// of it reaches the terminal.
	return render.OneLine(s)
}
