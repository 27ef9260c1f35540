//go:build unix

package proc_test

import (
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/proc"
)

// A process's stdout ends once it has exited and the pipe is empty, not
// when the last holder of the pipe lets go: what the process wrote before
// it exited is read whole by a reader that begins long after, and a child
// that left its group and session, holding the pipe, does not keep the
// reader waiting.
func TestStdoutEndsAtTheProcesssExit(t *testing.T) {
	t.Parallel()
	// 60 KiB (within the pipe's buffer), then a child in a session of its
	// own, its environment cleared (no token), holding stdout for a
	// minute, then the exit.
	out := exitedLeavingAChild(t, `head -c 61440 /dev/zero | tr '\0' x; env -i setsid sleep 60 & echo $! >&2; sleep 1; exit 0`)
	time.Sleep(2 * time.Second) // past any grace after the exit
	got, ok := readAll(out, 30*time.Second)
	if !ok {
		t.Fatal("stdout did not end though the process exited: the child holding it keeps it open")
	}
	if len(got) != 61440 || strings.Trim(got, "x") != "" {
		t.Errorf("read %d bytes of the 61440 the process wrote before it exited", len(got))
	}
}

// A child that left the group and the token and keeps writing to the
// stdout it inherited (here `yes`) kept the pipe from ever being empty:
// stdout ended only when the pipe was empty at a check, so it never did.
// Once the process has exited, what the pipe held then is read, and no
// more.
func TestStdoutEndsAtTheProcesssExitWhateverAChildWrites(t *testing.T) {
	t.Parallel()
	out := exitedLeavingAChild(t, `printf 'last words\n'; env -i setsid sh -c 'exec yes tick' </dev/null 2>/dev/null & echo $! >&2; sleep 1; exit 0`)
	got, ok := readAll(out, 15*time.Second)
	if !ok {
		t.Fatal("15 s after the process exited its stdout has not ended: an escaped child that keeps writing keeps it open")
	}
	if n := len(got); n < len("last words\n") || n > 1<<20 {
		t.Errorf("stdout ended after %d bytes: want what the pipe held at the exit", n)
	}
}

// exitedLeavingAChild runs script, which prints the pid of a child it
// leaves behind on stderr, and returns its stdout once it has exited; the
// child, which escaped everything but this, is the test's to end.
func exitedLeavingAChild(t *testing.T, script string) io.ReadCloser {
	t.Helper()
	p, out, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("the process did not end")
	}
	t.Cleanup(func() {
		if pid, err := strconv.Atoi(strings.TrimSpace(p.StderrTail())); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return out
}

// readAll reads r to its end, if that comes within d.
func readAll(r io.Reader, d time.Duration) (string, bool) {
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	select {
	case s := <-read:
		return s, true
	case <-time.After(d):
		return "", false
	}
}
