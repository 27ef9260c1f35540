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
	script := `head -c 61440 /dev/zero | tr '\0' x; env -i setsid sleep 60 & echo $! >&2; sleep 1; exit 0`
	p, out, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("the process did not end")
	}
	t.Cleanup(func() {
		// The child escaped everything but this: it is the test's to end.
		if pid, err := strconv.Atoi(strings.TrimSpace(p.StderrTail())); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	time.Sleep(2 * time.Second) // past any grace after the exit
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(out)
		read <- string(b)
	}()
	select {
	case got := <-read:
		if len(got) != 61440 || strings.Trim(got, "x") != "" {
			t.Errorf("read %d bytes of the 61440 the process wrote before it exited", len(got))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("stdout did not end though the process exited: the child holding it keeps it open")
	}
}
