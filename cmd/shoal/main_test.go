package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shoalfabric/shoal/internal/natstest"
)

// The test binary doubles as the shoal binary: with SHOAL_TEST_MAIN=1 it
// runs main, so tests drive real processes without a go build. Shoal's
// own hidden verbs (__sandbox, __reaper, …) run main too: a node starts
// them with its agents' environment, which holds none of Shoal's
// variables.
func TestMain(m *testing.M) {
	if os.Getenv(mcpServerMode) == "1" {
		runTestMCPServer()
	}
	if os.Getenv(natsServerMode) != "" {
		runTestNATSServer()
	}
	if os.Getenv("SHOAL_TEST_MAIN") == "1" || (len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "__") && os.Getenv("SHOAL_TEST_MAIN") != "0") {
		main()
		return
	}
	goleak.VerifyTestMain(m, natstest.KnownLeaks...)
}

// shoalProc is a shoal process started by a test.
type shoalProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	stdout []string
	stderr bytes.Buffer
	lines  chan string
}

// startShoal runs `shoal args...` with a private HOME and XDG dirs under
// dir, plus env.
func startShoal(t *testing.T, dir string, env []string, args ...string) *shoalProc {
	t.Helper()
	return startCommand(t, dir, env, append([]string{os.Args[0]}, args...))
}

// startCommand is startShoal for a command line of its own (one that runs
// shoal in the end, under a wrapper).
func startCommand(t *testing.T, dir string, env []string, argv []string) *shoalProc {
	t.Helper()
	args := argv[1:]
	cmd := exec.Command(argv[0], args...)
	cmd.Env = append(baseEnv(dir), env...)
	p := &shoalProc{t: t, cmd: cmd, done: make(chan struct{}), lines: make(chan string, 100)}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.stdout = append(p.stdout, sc.Text())
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		close(p.lines)
	}()
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("shoal %s wrote on stderr:\n%s", strings.Join(args, " "), p.stderrText())
		}
	})
	return p
}

func baseEnv(dir string) []string {
	return []string{
		"SHOAL_TEST_MAIN=1",
		"HOME=" + dir,
		"XDG_DATA_HOME=" + dir + "/data",
		"XDG_CONFIG_HOME=" + dir + "/config",
		"XDG_CACHE_HOME=" + dir + "/cache",
		"PATH=" + os.Getenv("PATH"),
	}
}

// waitLine returns the first stdout line with prefix.
func (p *shoalProc) waitLine(prefix string) string {
	p.t.Helper()
	return p.waitLineWithin(prefix, 30*time.Second)
}

// waitLineWithin is waitLine with its own deadline.
func (p *shoalProc) waitLineWithin(prefix string, d time.Duration) string {
	p.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("shoal exited before printing %q; stderr:\n%s", prefix, p.stderrText())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			p.t.Fatalf("shoal did not print %q in time; stderr:\n%s", prefix, p.stderrText())
		}
	}
}

// stop sends sig and returns the exit code.
func (p *shoalProc) stop(sig syscall.Signal) int {
	p.t.Helper()
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("shoal did not exit after %v", sig)
	}
	return p.cmd.ProcessState.ExitCode()
}

// stdoutLines is what the process has printed on stdout so far.
func (p *shoalProc) stdoutLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stdout...)
}

func (p *shoalProc) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// runShoal runs shoal to completion and returns its exit code and output.
func runShoal(t *testing.T, dir string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	// A safety net only: the command's own timeouts (--timeout, a run's
	// --wait) decide, and on a loaded machine a slow agent CLI
	// start must not be cut short by the test.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(baseEnv(dir), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run shoal %v: %v", args, err)
		}
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

// processState is the state letter of /proc/<pid>/stat ("Z" for a
// zombie), or "" when there is no such process.
func processState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || len(s) < i+3 {
		return ""
	}
	return s[i+2 : i+3]
}
