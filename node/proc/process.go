package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process is an agent CLI running in its own process group, with a
// parent-death signal where the platform has one, so that neither it nor
// anything it starts outlives its node. When the CLI exits, whatever is
// left in its group is killed.
type Process struct {
	pid        int
	signal     func(os.Signal) error
	kill       func() // SIGKILLs what is left of the process and what it started
	done       chan struct{}
	err        error // the exit error, valid once done is closed
	stderrDone chan struct{}

	// stdin is the write end of the agent's standard input. It is a
	// pollable pipe, so every write has a deadline: an agent that stops
	// reading can never hold up whoever writes to it, and closing stdin
	// never waits for a write in progress.
	stdin        *os.File
	writeTimeout time.Duration
	writing      chan struct{} // held by the one write in progress
	stalled      atomic.Bool   // a write missed its deadline
	stopOnce     sync.Once
	stopping     chan struct{}
	tail         *Ring
}

// ProcessSpec describes a process to start.
type ProcessSpec struct {
	Argv   []string
	Dir    string
	Env    []string
	Stderr io.Writer // also kept in the tail StderrTail returns
	// WriteTimeout bounds each write to the process's stdin;
	// DefaultWriteTimeout when zero.
	WriteTimeout time.Duration
	// Reaper holds the process, so that everything it starts ends with it
	// and with the node; without one it is only its own process group.
	Reaper *Reaper
	// Keeper, when there is no Reaper, runs the process under a keeper
	// (`Keeper... -- <argv>`, RunKeeper): what a Reaper does on macOS.
	Keeper []string
	// Sandbox, when set, confines the process and everything it starts:
	// it is started through the sandbox wrapper (RunSandbox), or in
	// namespaces of its own under their init (RunSandboxInit).
	Sandbox *Confinement

	edge *edge // the node's side of a sandbox in namespaces; nil for none
}

// DefaultWriteTimeout is how long an agent may leave a line written to
// its stdin unread before it counts as stalled.
const DefaultWriteTimeout = 10 * time.Second

// ErrStalled says an agent did not read its standard input within the
// write timeout. Half a line may be left in the pipe, so nothing more is
// written to it: the agent can only be stopped.
var ErrStalled = errors.New("the agent stopped reading its input")

// ErrExited and ErrStopping say why nothing can be written to an agent
// whose process has ended or is being stopped: its end is on its way.
var (
	ErrExited   = errors.New("the agent process has exited")
	ErrStopping = errors.New("the agent is stopping")
)

// ErrReaperGone is in the error of a start that failed because the node's
// reaper had died: the node can start the process again once it has
// another.
var ErrReaperGone = errors.New("the node's reaper is gone")

// StartProcess runs spec and returns its stdout. The reader reaches EOF
// once the process and everything in its group are gone and the pipe
// holds nothing more (endAtExit); the process is reaped independently of
// it, so a child holding the pipe open can never keep a dead agent
// looking alive. With a Reaper, everything the process
// starts, in whatever session or group, ends with it and with its node.
func StartProcess(spec ProcessSpec) (*Process, io.ReadCloser, error) {
	if len(spec.Argv) == 0 {
		return nil, nil, errors.New("no command to run")
	}
	// A key given twice means its last value, as os/exec has it; a
	// process started another way would see the first (opencode did, and
	// missed its per-agent configuration).
	spec.Env = dedupeEnv(spec.Env)
	if spec.Sandbox != nil {
		spec.Env = allowedEnv(spec.Env, spec.Sandbox.Env)
		exe, err := exec.LookPath(spec.Argv[0])
		if err != nil {
			return nil, nil, launchError(spec.Argv[0], err)
		}
		// A command named by a link outside its install (an installer's
		// ~/.local/bin/claude) runs at the path the link stands for: the
		// sandbox grants the install there (InstallRoot), and a root of
		// namespaces of its own holds nothing else.
		if real, err := filepath.EvalSymlinks(exe); err == nil && real != exe {
			if abs, err := filepath.Abs(real); err == nil {
				spec.Argv = append([]string{abs}, spec.Argv[1:]...)
			}
		}
		var argv []string
		if spec.Sandbox.Namespaces {
			spec.edge, argv, err = newEdge(spec.Sandbox, spec.Argv)
		} else {
			argv, err = spec.Sandbox.wrap(spec.Argv)
		}
		if err != nil {
			return nil, nil, err
		}
		spec.Argv = argv
	}
	start := startDirect
	if spec.Reaper != nil {
		start = func(spec ProcessSpec, _ []string) (*Process, io.ReadCloser, error) { return spec.Reaper.start(spec) }
	}
	p, out, err := start(spec, spec.Keeper)
	if f, ok := out.(*os.File); ok && err == nil {
		out = endAtExit(p, f)
	}
	if spec.edge == nil {
		return p, out, err
	}
	if err != nil {
		spec.edge.close()
		return nil, nil, err
	}
	if err := spec.edge.serve(p.done); err != nil {
		p.Kill()
		out.Close()
		return nil, nil, err
	}
	return p, out, nil
}

// startDirect runs spec as a child of the node, held by keeper when it is
// given (see RunKeeper).
func startDirect(spec ProcessSpec, keeper []string) (*Process, io.ReadCloser, error) {
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	cmd.SysProcAttr = sysProcAttr()
	lifeline, keeperEnd, err := keep(cmd, spec.Argv, keeper)
	if err != nil {
		return nil, nil, err
	}
	if spec.edge != nil {
		if keeper != nil {
			return nil, nil, errors.New("a sandbox in namespaces of its own cannot run under a keeper")
		}
		cmd.SysProcAttr = nsAttr()
		cmd.ExtraFiles = []*os.File{spec.edge.theirs} // the init's descriptor 3
	}
	if keeperEnd != nil {
		defer keeperEnd.Close() // the keeper has its own copy
	}
	pipes, err := newPipes(spec.Sandbox != nil)
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes.inR, pipes.outW, pipes.errW
	err = cmd.Start()
	pipes.closeChildEnds() // the child has its own copies
	if err != nil {
		pipes.closeOurEnds()
		if lifeline != nil {
			lifeline.Close()
		}
		return nil, nil, launchError(spec.Argv[0], err)
	}
	pid := cmd.Process.Pid
	p := newProcess(spec, pid, pipes, cmd.Process.Signal, func() { killGroup(pid) })
	go func() {
		err := cmd.Wait()
		if lifeline != nil {
			lifeline.Close()
		}
		killGroup(pid)
		p.exited(err)
	}()
	return p, pipes.outR, nil
}

// newProcess is the node's handle on a started process: its stdin with
// deadlines, its stderr read into the tail (and spec.Stderr).
func newProcess(spec ProcessSpec, pid int, pipes *pipes, signal func(os.Signal) error, kill func()) *Process {
	timeout := spec.WriteTimeout
	if timeout <= 0 {
		timeout = DefaultWriteTimeout
	}
	p := &Process{pid: pid, signal: signal, kill: kill, done: make(chan struct{}), stdin: pipes.inW, writeTimeout: timeout,
		writing: make(chan struct{}, 1), stopping: make(chan struct{}), tail: NewRing(4 << 10), stderrDone: make(chan struct{})}
	var sink io.Writer = p.tail
	if spec.Stderr != nil {
		sink = io.MultiWriter(spec.Stderr, p.tail)
	}
	errR := pipes.errR
	go func() {
		// A small buffer: io.Copy would hold 32 KiB per agent for a
		// stream that is mostly quiet. The wrappers keep it from being
		// bypassed.
		io.CopyBuffer(struct{ io.Writer }{sink}, struct{ io.Reader }{errR}, make([]byte, 4<<10))
		errR.Close()
		close(p.stderrDone)
	}()
	return p
}

// exited records how the process ended, once everything it started is
// gone. The last words on stderr explain the exit, so they are read
// before Done; a process that escaped and holds the pipe gets only a
// moment.
func (p *Process) exited(err error) {
	p.err = err
	select {
	case <-p.stderrDone:
	case <-time.After(time.Second):
	}
	close(p.done)
}

// PID is the process id, which is also its process group id.
func (p *Process) PID() int { return p.pid }

// Done is closed once the process has exited, its group been killed and
// its stderr read to the end.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited; valid once Done is closed.
func (p *Process) Err() error { return p.err }

// Stopping is closed once Stop has been called.
func (p *Process) Stopping() <-chan struct{} { return p.stopping }

// StderrTail returns the last few KiB the process wrote to stderr.
func (p *Process) StderrTail() string { return p.tail.String() }

// WriteLine writes one line to the process's stdin, within ctx and the
// write timeout (waiting for a write in progress included). An agent that
// does not take the line in time is stalled: the error wraps ErrStalled,
// and every later write fails at once.
func (p *Process) WriteLine(ctx context.Context, b []byte) error {
	buf := make([]byte, 0, len(b)+1)
	d, ok := ctx.Deadline()
	_, err := p.write(ctx.Done(), ctx.Err, d, ok, append(append(buf, b...), '\n'))
	return err
}

// Write writes b to the process's stdin as it is, within the write
// timeout; for a protocol library that writes its own lines.
func (p *Process) Write(b []byte) (int, error) {
	return p.write(nil, nil, time.Time{}, false, b)
}

// write writes b within the write timeout and, when given, until
// cancelled (whose cause is why) or the caller's deadline.
func (p *Process) write(cancelled <-chan struct{}, why func() error, callerDeadline time.Time, hasDeadline bool, b []byte) (int, error) {
	start := time.Now()
	deadline, byCaller := start.Add(p.writeTimeout), false
	if hasDeadline && callerDeadline.Before(deadline) {
		deadline, byCaller = callerDeadline, true
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case p.writing <- struct{}{}:
		defer func() { <-p.writing }()
	case <-wait.C:
		if byCaller {
			return 0, context.DeadlineExceeded
		}
		p.stalled.Store(true)
		return 0, fmt.Errorf("%w: a write before this one was not read within %s", ErrStalled, p.writeTimeout)
	case <-cancelled:
		return 0, why()
	}
	if err := p.writable(); err != nil {
		return 0, err
	}
	p.stdin.SetWriteDeadline(deadline)
	n, err := p.stdin.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if byCaller && n == 0 {
			return 0, context.DeadlineExceeded // nothing half written: the agent may still read later
		}
		p.stalled.Store(true)
		return n, fmt.Errorf("%w: it read %d of %d bytes in %s", ErrStalled, n, len(b), time.Since(start).Round(time.Millisecond))
	}
	if err != nil {
		if werr := p.writable(); werr != nil {
			return n, werr
		}
		return n, fmt.Errorf("write to the agent: %w", err)
	}
	return n, nil
}

// writable says why nothing can be written to the process, or nil.
func (p *Process) writable() error {
	select {
	case <-p.done:
		return ErrExited
	case <-p.stopping:
		return ErrStopping
	default:
	}
	if p.stalled.Load() {
		return fmt.Errorf("%w earlier; nothing more is written to it", ErrStalled)
	}
	return nil
}

// Kill SIGKILLs the process and what it started, and returns once it is
// gone.
func (p *Process) Kill() {
	p.stopOnce.Do(func() {
		close(p.stopping)
		p.kill()
		p.stdin.Close()
	})
	<-p.done
}

// Stdin is the process's standard input for a library that writes its
// own lines: writes have the write timeout, and Close closes it.
func (p *Process) Stdin() io.WriteCloser { return stdinOf{p} }

type stdinOf struct{ p *Process }

func (s stdinOf) Write(b []byte) (int, error) { return s.p.Write(b) }
func (s stdinOf) Close() error                { return s.p.stdin.Close() }

// Stalled reports whether a write to the process missed its deadline.
func (p *Process) Stalled() bool { return p.stalled.Load() }

// Step is one rung of a stop ladder: send Signal (CloseStdin closes
// stdin instead), then give the process Wait to exit.
type Step struct {
	Signal os.Signal
	Wait   time.Duration
}

// CloseStdin is the Step signal that closes the process's stdin.
var CloseStdin os.Signal = closeStdin{}

type closeStdin struct{}

func (closeStdin) String() string { return "close stdin" }
func (closeStdin) Signal()        {}

// Stop climbs the ladder until the process exits (or ctx ends), then
// kills whatever is left of its process group. It is idempotent; every
// call returns once the process is gone.
func (p *Process) Stop(ctx context.Context, ladder []Step) {
	p.stopOnce.Do(func() {
		close(p.stopping)
		for _, s := range ladder {
			if s.Signal == CloseStdin {
				// A write in progress fails at once; it never delays this.
				p.stdin.Close()
			} else {
				p.signal(s.Signal)
			}
			if p.exitedWithin(ctx, s.Wait) {
				break
			}
		}
		p.kill()
		p.stdin.Close()
	})
	<-p.done
}

// exitedWithin waits up to d for the process to exit, and reports whether
// it did or ctx ended.
func (p *Process) exitedWithin(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-ctx.Done():
		return true
	case <-t.C:
		return false
	}
}

// launchError explains a failed spawn without the environment, which the
// raw error may carry.
func launchError(name string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return &LaunchError{fmt.Sprintf("could not launch `%s`: not found on PATH; install it on this node or give its path", name)}
	case errors.Is(err, os.ErrPermission):
		return &LaunchError{fmt.Sprintf("could not launch `%s`: permission denied", name)}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return &LaunchError{fmt.Sprintf("could not launch `%s` (%s)", name, errno.Error())}
	}
	return &LaunchError{fmt.Sprintf("could not launch `%s`", name)}
}

// LaunchError says an agent's program could not be started on this
// machine (missing, not executable): the node cannot run it, whatever
// the request. It never carries the environment.
type LaunchError struct{ msg string }

func (e *LaunchError) Error() string { return e.msg }

// ExitDescription says how a process ended: "exit status 1", "killed by
// signal: terminated".
func ExitDescription(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by signal: " + ws.Signal().String()
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	var es *ExitStatus
	if errors.As(err, &es) {
		return es.Error()
	}
	return err.Error()
}

// ExitStatus is how a process the reaper held ended: its wait status.
type ExitStatus struct{ Status syscall.WaitStatus }

func (e *ExitStatus) Error() string {
	if e.Status.Signaled() {
		return "killed by signal: " + e.Status.Signal().String()
	}
	return fmt.Sprintf("exit status %d", e.Status.ExitStatus())
}

// Ring keeps the last n bytes written to it (a process's stderr, say); safe
// for concurrent use.
type Ring struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

// NewRing returns a Ring of n bytes.
func NewRing(n int) *Ring { return &Ring{n: n} }

func (t *Ring) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

// String returns the kept bytes with surrounding space trimmed.
func (t *Ring) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// LastLine returns the last non-empty line of s.
func LastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return s
}

// ReadLine reads one line of at most max bytes. A longer line is consumed
// to its end; its length is returned as tooLong along with its first KiB.
func ReadLine(r *bufio.Reader, max int) (line []byte, tooLong int, err error) {
	return ReadLineInto(nil, r, max)
}

// ReadLineInto is ReadLine reading into buf's storage, for a reader that
// is done with each line before it reads the next.
func ReadLineInto(buf []byte, r *bufio.Reader, max int) (line []byte, tooLong int, err error) {
	line = buf[:0]
	for {
		chunk, err := r.ReadSlice('\n')
		if tooLong == 0 && len(line)+len(chunk) <= max {
			line = append(line, chunk...)
		} else {
			if tooLong == 0 {
				tooLong = len(line)
				line = line[:min(len(line), 1<<10)]
			}
			tooLong += len(chunk)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, tooLong, err
	}
}

// dedupeEnv keeps the last value of each key, in the order of first
// appearance.
func dedupeEnv(env []string) []string {
	last := map[string]int{}
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		last[k] = i
	}
	out := make([]string, 0, len(last))
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if last[k] == i {
			out = append(out, kv)
		}
	}
	return out
}

// EnvValue is the value of key in env, the last one set winning, or "".
func EnvValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// pipes are a process's stdin, stdout and stderr. The node's end of stdin
// is pollable (os.Pipe), so writes to it can have deadlines; the child's
// ends are handed over blocking, as programs expect.
type pipes struct {
	inR, inW, outR, outW, errR, errW *os.File
}

func newPipes(sockets bool) (*pipes, error) {
	var p pipes
	var err error
	mk := os.Pipe
	if sockets {
		mk = socketPipe
	}
	if p.inR, p.inW, err = mk(); err != nil {
		return nil, err
	}
	if p.outR, p.outW, err = mk(); err != nil {
		p.inR.Close()
		p.inW.Close()
		return nil, err
	}
	if p.errR, p.errW, err = mk(); err != nil {
		p.closeChildEnds()
		p.closeOurEnds()
		return nil, err
	}
	return &p, nil
}

func (p *pipes) closeChildEnds() {
	for _, f := range []*os.File{p.inR, p.outW, p.errW} {
		if f != nil {
			f.Close()
		}
	}
}

func (p *pipes) closeOurEnds() {
	for _, f := range []*os.File{p.inW, p.outR, p.errR} {
		if f != nil {
			f.Close()
		}
	}
}

// allowedEnv keeps of env the variables allow names (a name, or a prefix
// ending in "*"); an empty allow keeps it all.
func allowedEnv(env, allow []string) []string {
	if len(allow) == 0 {
		return env
	}
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if slices.ContainsFunc(allow, func(a string) bool {
			p, prefix := strings.CutSuffix(a, "*")
			return name == a || (prefix && strings.HasPrefix(name, p))
		}) {
			out = append(out, kv)
		}
	}
	return out
}

// NodeEnviron is the node's environment as its agents get it: without
// Shoal's own variables (SHOAL_*), which carry the node's tokens and
// settings (SHOAL_MCP_TOKEN, SHOAL_CREDS, …) and are no agent's. What an
// agent is given of Shoal's (its id, its life, its permission endpoint) is
// added to its spec.
func NodeEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOAL_") {
			out = append(out, kv)
		}
	}
	return out
}

// exitGrace is how long the stdout of a process that has exited is read
// for more once the pipe is empty.
const exitGrace = 500 * time.Millisecond

// An exitReader is a process's stdout, which ends once the process has
// exited (everything in its group and under its token killed) and what
// the pipe held then has been read. A child that left the group and the
// token (a daemon in a session of its own, its environment cleared)
// holds the pipe open: its reader would wait for an end that comes when
// the child's life does, and the dead agent stay alive that long, or
// longer if the child keeps writing. What the process wrote before it
// exited is read whole, however long its reader waits before reading it;
// what the child writes after, beyond it, is not.
type exitReader struct {
	f *os.File
	// left is how much more may be read once the process has exited:
	// what the pipe held then; -1 before.
	left atomic.Int64
}

func endAtExit(p *Process, f *os.File) io.ReadCloser {
	r := &exitReader{f: f}
	r.left.Store(-1)
	go func() {
		<-p.done
		r.left.Store(int64(unread(f)))
		f.SetReadDeadline(time.Now().Add(exitGrace))
	}()
	return r
}

func (r *exitReader) Read(b []byte) (int, error) {
	for {
		left := r.left.Load()
		if left == 0 {
			return 0, io.EOF
		}
		if left > 0 && int64(len(b)) > left {
			b = b[:left]
		}
		n, err := r.f.Read(b)
		if left > 0 {
			r.left.Add(-int64(min(int64(n), left)))
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		// The process has exited: only then is there a deadline.
		if unread(r.f) == 0 {
			return n, io.EOF
		}
		r.f.SetReadDeadline(time.Now().Add(exitGrace))
		if n > 0 {
			return n, nil
		}
	}
}

func (r *exitReader) Close() error { return r.f.Close() }

// unread is how many bytes the pipe f reads holds.
func unread(f *os.File) int {
	c, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	c.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), fionread) })
	return n
}
