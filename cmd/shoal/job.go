package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// jobRunArg is the argument of `shoal job` that runs a detached job: the
// process `--detach` starts reads the job from its stdin.
const jobRunArg = "__run"

func jobCommand() *command {
	return verbCommand("job", `--repo <dir> [--then <prompt>]… <prompt…|-> | wait <job> | ls`, "run a prompt on a repository and bring its work back as a branch",
		`Opens an agent on the repository (as open --repo does, on whichever node
placement chooses), runs the prompt as its turn and each --then after it
(each once the one before ended well), brings its work back as branch
shoal/<job> (as fetch does; the job's id is its agent's), closes the agent
and prints the outcome: the branch and its commit and the diff's stat on
stdout, and on stderr how the job ended, how long it took and what its
turns used. Exits 0 when every turn ended well; when one failed (an
error, or a stop other than the end of its turn) the work it did is
fetched all the same and the job exits non-zero, saying why.

With --detach the job runs in a process of its own, apart from this
terminal (its log in the cache directory's shoal/jobs/<job>.log), and its
id is printed at once. shoal job wait <job> waits for a job and prints its
outcome, with the same exit status; shoal job ls lists the jobs the fabric
keeps (30 days), running, succeeded, failed, or lost when the process
running one has not been heard from for 45 seconds.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var spec client.JobSpec
			var labelList string
			var sandbox optionalBool
			var then stringList
			var detach bool
			fs.StringVar(&spec.Source.Dir, "repo", "", "the git repository at `dir` of this machine the job works on")
			fs.StringVar(&spec.Source.Ref, "ref", "", "the `ref` the job starts on (default HEAD)")
			fs.BoolVar(&spec.Source.WithChanges, "with-changes", false, "start on the uncommitted work, on top of HEAD")
			fs.Var(&then, "then", "a `prompt` to run after the one before ended well (repeatable)")
			fs.StringVar(&spec.Open.Model, "model", schemas.DefaultModel, "`model` alias or id, with an optional backend prefix")
			fs.StringVar(&spec.Open.Permission, "permission", "default", "permission `preset`: default, ask, notebook, specialist, lab, auto or bypass")
			fs.StringVar(&spec.Open.Node, "node", "", "the `node` to run on (default: placement chooses)")
			fs.StringVar(&labelList, "labels", "", "comma-separated `key=value` labels the node must carry")
			fs.Var(&sandbox, "sandbox", "run the job's agent in its node's kernel sandbox (default: the node's --sandbox mode)")
			durationFlag(fs, &spec.TurnTimeout, "wait", schemas.DefaultRunTimeout, "give up on each turn after this `duration`")
			fs.BoolVar(&detach, "detach", false, "run the job apart from this terminal and print its id at once")
			return func(ctx context.Context, v *verb, args []string) error {
				if len(args) > 0 && spec.Source.Dir == "" {
					switch args[0] {
					case "wait":
						return v.waitJob(ctx, args[1:])
					case "ls":
						return v.listJobs(ctx, args[1:])
					case jobRunArg:
						return v.runDetached(ctx)
					}
				}
				if spec.Source.Dir == "" {
					return usagef("job needs --repo DIR: the repository it works on (or: shoal job wait <job>, shoal job ls)")
				}
				if spec.TurnTimeout <= 0 {
					return usagef("--wait %s: a job's turn needs some time; give a duration such as 30m", spec.TurnTimeout)
				}
				text, err := textArg(v.env, args)
				if err != nil {
					return err
				}
				spec.Turns = append([]string{text}, then...)
				for i, t := range then {
					if strings.TrimSpace(t) == "" {
						return usagef("--then number %d is empty", i+1)
					}
				}
				spec.Open.Sandbox = sandbox.value
				if labelList != "" {
					if spec.Open.Labels, err = parseLabels(labelList); err != nil {
						return err
					}
				}
				if spec.Source.Dir, err = filepath.Abs(spec.Source.Dir); err != nil {
					return err
				}
				// Once begun, a job outlives an outage of the fabric of
				// any length; Ctrl-C stops it.
				v.client.persistent = true
				d, err := v.direct(noObjectStore)
				if err != nil {
					return err
				}
				if detach {
					return v.detachJob(ctx, d, spec)
				}
				spec.Started = func(id string) { fmt.Fprintf(v.env.io.err, "shoal: job %s started\n", id) }
				job, err := d.RunJob(ctx, spec)
				return v.jobOutcome(job, err)
			}
		})
}

// detachedJob is what `shoal job --detach` hands the process that runs
// the job, on its stdin.
type detachedJob struct {
	ID          string              `json:"id"`
	Open        schemas.OpenRequest `json:"open"`
	Source      client.RepoSource   `json:"source"`
	Turns       []string            `json:"turns"`
	TurnTimeout time.Duration       `json:"turn_timeout"`
}

// detachJob starts a process of its own for the job, apart from this
// terminal, and prints the job's id once its record is stored.
func (v *verb) detachJob(ctx context.Context, d *client.Direct, spec client.JobSpec) error {
	id := schemas.NewAgentID()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(cacheHome(v.env.getenv), "shoal", "jobs", id+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	body, _ := json.Marshal(detachedJob{ID: id, Open: spec.Open, Source: spec.Source, Turns: spec.Turns, TurnTimeout: spec.TurnTimeout})
	// The connection as this process has it, flags and all.
	args := []string{"job", "--nats", v.client.url}
	for _, f := range [][2]string{{"creds", v.client.creds}, {"tls-ca", v.client.tls.ca}, {"tls-cert", v.client.tls.cert}, {"tls-key", v.client.tls.key}} {
		if f[1] != "" {
			abs, err := filepath.Abs(f[1])
			if err != nil {
				return err
			}
			args = append(args, "--"+f[0], abs)
		}
	}
	cmd := exec.Command(self, append(args, jobRunArg)...)
	cmd.Stdin = strings.NewReader(string(body))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the job's process: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		if _, err := d.Job(ctx, id); err == nil {
			cmd.Process.Release()
			fmt.Fprintf(v.env.io.err, "shoal: job %s runs apart (log %s); shoal job wait %s follows it\n", id, logPath, id)
			return v.reply(map[string]string{"id": id, "log": logPath}, id)
		}
		select {
		case err := <-exited:
			// It failed as the job would have here: its last words and
			// its exit status are this command's.
			b, _ := os.ReadFile(logPath)
			said := strings.TrimSpace(string(b))
			if i := strings.LastIndex(said, "shoal job: "); i >= 0 {
				said = strings.TrimPrefix(said[i:], "shoal job: ")
			}
			if e, ok := errors.AsType[*exec.ExitError](err); ok && e.ExitCode() > 0 {
				return &exitStatusError{code: e.ExitCode(), msg: said}
			}
			return fmt.Errorf("the job's process ended before the job began (%v): %s", err, said)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runDetached is the process --detach starts: it runs the job its stdin
// names.
func (v *verb) runDetached(ctx context.Context) error {
	b, err := io.ReadAll(v.env.io.in)
	if err != nil {
		return err
	}
	var j detachedJob
	if err := json.Unmarshal(b, &j); err != nil || j.ID == "" {
		return usagef("shoal job %s runs a job shoal job --detach hands it on stdin, not %.40q", jobRunArg, b)
	}
	// The job outlives an outage of the fabric of any length, as its
	// node does: it has nobody to tell it failed.
	v.client.persistent = true
	d, err := v.direct(noObjectStore)
	if err != nil {
		return err
	}
	j.Open.ID = j.ID
	// The job goes on whatever happens to the terminal it came from.
	signalIgnoreHangup()
	job, err := d.RunJob(ctx, client.JobSpec{Open: j.Open, Source: j.Source, Turns: j.Turns, TurnTimeout: j.TurnTimeout,
		Started: func(id string) { fmt.Fprintf(v.env.io.err, "shoal: job %s started\n", id) }})
	return v.jobOutcome(job, err)
}

// waitJob is `shoal job wait <job>`.
func (v *verb) waitJob(ctx context.Context, args []string) error {
	id, err := oneAgent(args)
	if err != nil {
		return err
	}
	d, err := v.direct(noObjectStore)
	if err != nil {
		return err
	}
	job, err := d.WaitJob(ctx, id)
	if err != nil {
		return err
	}
	return v.jobOutcome(job, jobError(job))
}

// listJobs is `shoal job ls`.
func (v *verb) listJobs(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	d, err := v.direct(noObjectStore)
	if err != nil {
		return err
	}
	jobs, err := d.Jobs(ctx)
	if err != nil {
		return err
	}
	if v.json {
		return printJSON(v.env, map[string]any{"jobs": jobs})
	}
	tw := tabwriter.NewWriter(v.text(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATUS\tTURNS\tNODE\tTOOK\tBRANCH\tREPO")
	for _, j := range jobs {
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", render.Cell(j.ID), render.Cell(string(j.Status)), j.Done, len(j.Turns), render.Cell(dash(j.Node)), took(j), render.Cell(dash(j.Branch)), render.Cell(j.Repo))
	}
	return tw.Flush()
}

// jobError is why an ended job failed, nil when it succeeded.
func jobError(j schemas.JobRecord) error {
	switch j.Status {
	case schemas.JobSucceeded:
		return nil
	case schemas.JobLost:
		// Its agent, whose id is the job's, may be alive still, its
		// work not fetched.
		return fmt.Errorf("job %s was lost: the process running it on %s has not been heard from for %ds; its agent %s may still be open: `shoal fetch %s` brings its work back, `shoal close %s` ends it", j.ID, j.Runner, schemas.JobLostAfterSeconds, j.ID, j.ID, j.ID)
	}
	return fmt.Errorf("job %s failed: %s", j.ID, j.Error)
}

// jobOutcome prints how a job ended: the branch and the diff's stat on
// stdout (or the record as JSON), its status line on stderr; err, when the
// job failed, is what the command returns.
func (v *verb) jobOutcome(j schemas.JobRecord, err error) error {
	if j.ID == "" {
		return err // it never began
	}
	if v.json {
		if perr := printJSON(v.env, j); perr != nil {
			return perr
		}
	} else if j.Branch != "" {
		fmt.Fprintln(v.text(), fetchedLine(client.Fetched{Branch: j.Branch, Tip: j.Tip, Commits: j.Commits, Files: j.Files}))
		fmt.Fprint(v.text(), j.Stat) // the node's diff stat
	}
	status := string(j.Status)
	if j.Status == schemas.JobRunning {
		status = "is still running"
	}
	fmt.Fprintf(v.env.io.err, "shoal: job %s %s after %s: %d of %d turns%s\n", j.ID, status, took(j), j.Done, len(j.Turns), spent(j.Usage))
	if err != nil && !errors.Is(err, context.Canceled) {
		if j.Branch != "" {
			return fmt.Errorf("%w (its work so far is on %s)", err, j.Branch)
		}
		return err
	}
	return err
}

// took is how long a job ran, or has run.
func took(j schemas.JobRecord) string {
	end := j.EndedAt
	if end == 0 {
		end = j.Beat
	}
	return (time.Duration((end - j.StartedAt) * float64(time.Second))).Round(100 * time.Millisecond).String()
}

// spent says what a job's turns used.
func spent(u *schemas.Usage) string {
	if u == nil {
		return ""
	}
	s := fmt.Sprintf(", %d tokens in, %d out", u.InputTokens+u.CacheReadTokens+u.CacheCreationTokens, u.OutputTokens)
	if u.CostUSD != nil {
		s += fmt.Sprintf(", $%.4f", *u.CostUSD)
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }
func (l *stringList) reset()             { *l = nil }

// signalIgnoreHangup keeps a detached job's process alive when the
// terminal it was started from goes away.
func signalIgnoreHangup() { signal.Ignore(syscall.SIGHUP) }
