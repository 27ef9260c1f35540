package backend

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is an agent CLI running in its own process group, with a
// parent-death signal where the platform has one, so that neither it nor
// anything it starts outlives its node. When the CLI exits, whatever is
// left in its group is killed.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit error, valid once done is closed

	stdin    io.WriteCloser
	stdinMu  sync.Mutex
	stopOnce sync.Once
	stopping chan struct{}
	tail     *Tail
}

// ProcessSpec describes a process to start.
type ProcessSpec struct {
	Argv   []string
	Dir    string
	Env    []string
	Stderr io.Writer // also kept in the tail StderrTail returns
}

// StartProcess runs spec and returns its stdout. The reader reaches EOF
// once the process and everything in its group are gone; the process is
// reaped independently of it, so a child holding the pipe open can never
// keep a dead agent looking alive.
func StartProcess(spec ProcessSpec) (*Process, io.ReadCloser, error) {
	if len(spec.Argv) == 0 {
		return nil, nil, errors.New("no command to run")
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	cmd.SysProcAttr = sysProcAttr()
	lifeline, keeperEnd, err := keep(cmd, spec.Argv)
	if err != nil {
		return nil, nil, err
	}
	if keeperEnd != nil {
		defer keeperEnd.Close() // the keeper has its own copy
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close() // the child has its own copies
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if lifeline != nil {
			lifeline.Close()
		}
		return nil, nil, launchError(spec.Argv[0], err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{}), stdin: stdin, stopping: make(chan struct{}), tail: NewTail(4 << 10)}
	var sink io.Writer = p.tail
	if spec.Stderr != nil {
		sink = io.MultiWriter(spec.Stderr, p.tail)
	}
	stderrDone := make(chan struct{})
	go func() {
		// A small buffer: io.Copy would hold 32 KiB per agent for a
		// stream that is mostly quiet. The wrappers keep it from being
		// bypassed.
		io.CopyBuffer(struct{ io.Writer }{sink}, struct{ io.Reader }{errR}, make([]byte, 4<<10))
		errR.Close()
		close(stderrDone)
	}()
	go func() {
		p.err = cmd.Wait()
		if lifeline != nil {
			lifeline.Close()
		}
		killGroup(cmd.Process.Pid)
		// The last words on stderr explain the exit, so they are read
		// before Done; a process that escaped the group and holds the
		// pipe gets only a moment.
		select {
		case <-stderrDone:
		case <-time.After(time.Second):
		}
		close(p.done)
	}()
	return p, outR, nil
}

// ProcAttr is how a backend starts any process of an agent's (an MCP
// server, a helper): in its own process group, with the parent-death
// signal where the platform has one.
func ProcAttr() *syscall.SysProcAttr { return sysProcAttr() }

// PID is the process id, which is also its process group id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited, its group been killed and
// its stderr read to the end.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited; valid once Done is closed.
func (p *Process) Err() error { return p.err }

// Stopping is closed once Stop has been called.
func (p *Process) Stopping() <-chan struct{} { return p.stopping }

// StderrTail returns the last few KiB the process wrote to stderr.
func (p *Process) StderrTail() string { return p.tail.String() }

// WriteLine writes one line to the process's stdin.
func (p *Process) WriteLine(b []byte) error {
	buf := make([]byte, 0, len(b)+1)
	_, err := p.Write(append(append(buf, b...), '\n'))
	return err
}

// Write writes b to the process's stdin as it is.
func (p *Process) Write(b []byte) (int, error) {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	select {
	case <-p.stopping:
		return 0, errors.New("the agent is stopping")
	case <-p.done:
		return 0, errors.New("the agent process has exited")
	default:
	}
	return p.stdin.Write(b)
}

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
				p.stdinMu.Lock()
				p.stdin.Close()
				p.stdinMu.Unlock()
			} else {
				p.cmd.Process.Signal(s.Signal)
			}
			if p.exited(ctx, s.Wait) {
				break
			}
		}
		killGroup(p.PID())
	})
	<-p.done
}

// exited waits up to d for the process to exit, and reports whether it
// did or ctx ended.
func (p *Process) exited(ctx context.Context, d time.Duration) bool {
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
	return err.Error()
}

// Tail keeps the last n bytes written to it; safe for concurrent use.
type Tail struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

// NewTail returns a Tail of n bytes.
func NewTail(n int) *Tail { return &Tail{n: n} }

func (t *Tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

// String returns the kept bytes with surrounding space trimmed.
func (t *Tail) String() string {
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

// EnvValue is the value of key in env, the last one set winning, or "".
func EnvValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}
