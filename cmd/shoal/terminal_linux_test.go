package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/proctest"
)

// runOnTerminal runs a shoal command with its standard output a terminal
// (a pseudo-terminal's far end), as a person at a shell runs it: the
// terminal is the command's controlling terminal and the command is in its
// foreground. It returns what the terminal received; nothing answers
// what the command may ask the terminal.
func runOnTerminal(t *testing.T, env []string, args ...string) string {
	t.Helper()
	ptmx, n := proctest.PTY(t)
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(baseEnv(t.TempDir()), env...)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = tty, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 1}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close() // the command holds the terminal now
	var got bytes.Buffer
	read := make(chan struct{})
	go func() { io.Copy(&got, ptmx); close(read) }() // ends (EIO) once no process holds the terminal
	if err := cmd.Wait(); err != nil {
		t.Fatalf("shoal %v on a terminal: %v: %s", args, err, errb.String())
	}
	<-read
	return strings.ReplaceAll(got.String(), "\r\n", "\n")
}

// shoal diff prints the agent's work as git does when its output is a
// pipe (for git apply), but on a terminal what an agent wrote into its
// files cannot retitle it, set the clipboard or clear the screen: git's
// own diff goes through less, which shows such sequences as text.
func TestDiffOnATerminalIsCleaned(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	repo := oneCommitRepo(t, "repo", "one\n")
	a := c.must("open", "--repo", repo, "--permission", "bypass")
	in, _ := json.Marshal(map[string]string{"command": `printf 'plain\033]52;c;cHduZWQ=\007\033]0;TITLEPWN\033\\\033[2J\n' > evil.txt`, "description": "write"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Done."})
	if out := c.must("run", a, "Write evil.txt."); !strings.Contains(out, "Done.") {
		t.Fatalf("agent %s's turn said %q", a, out)
	}
	piped := c.must("diff", a)
	if !strings.Contains(piped, "+plain\x1b]52;c;cHduZWQ=\x07") {
		t.Fatalf("shoal diff to a pipe is not the file as it was written:\n%q", piped)
	}
	shown := runOnTerminal(t, c.client, "diff", a)
	if !strings.Contains(shown, "evil.txt") || !strings.Contains(shown, "+plain") {
		t.Fatalf("shoal diff on a terminal does not show the diff:\n%q", shown)
	}
	for _, bad := range []string{"\x1b", "\x07"} {
		if strings.Contains(shown, bad) {
			t.Errorf("shoal diff on a terminal printed %q of what the agent wrote:\n%q", bad, shown)
		}
	}
}

// Every shoal command starts at once on a terminal that answers no
// queries (a pseudo-terminal nobody emulates, as under script(1), some CI
// runners and serial consoles): nothing asks the terminal for its
// background colour or cursor position and waits for an answer that never
// comes. Bubble Tea v1, linked in for shoal tui, asked at init for every
// command and waited 5 s.
func TestVersionOnASilentTerminalStartsAtOnce(t *testing.T) {
	t.Parallel()
	start := time.Now()
	shown := runOnTerminal(t, []string{"TERM=xterm-256color"}, "version")
	took := time.Since(start)
	if strings.Contains(shown, "\x1b]11;?") {
		t.Errorf("shoal version asked the terminal for its background colour (took %v):\n%q", took.Round(time.Millisecond), shown)
	}
	if took > 2*time.Second {
		t.Errorf("shoal version on a terminal that answers nothing took %v, want under 2s; the terminal received:\n%q", took.Round(time.Millisecond), shown)
	}
}
