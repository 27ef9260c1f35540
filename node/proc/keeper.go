//go:build unix

package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// KeeperArg is the argument that makes a shoal binary a keeper.
const KeeperArg = "__keeper"

// RunKeeper is the keeper, which holds one agent process where there is
// no subreaper (macOS): it runs the agent given after "--" in its own
// process group (which the node created), marked with a token in its
// environment that everything it starts inherits, hands on the signals it
// gets, and exits as the agent did, once whatever carries the token is
// gone. If the lifeline on descriptor 3 ends first, the node is gone: it
// sends the group SIGTERM, then SIGKILLs the group and every process that
// carries the token, wherever it went.
func RunKeeper(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "keeper: no command to run")
		return 2
	}
	syscall.CloseOnExec(3) // the agent does not need the lifeline
	lifeline := os.NewFile(3, "lifeline")
	cmd := exec.Command(args[0], args[1:]...)
	token := newToken()
	cmd.Env = append(os.Environ(), procEnv+"="+token)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, launchError(args[0], err))
		return 127
	}
	gone := make(chan struct{})
	go func() {
		if lifeline != nil {
			io.Copy(io.Discard, lifeline)
		}
		close(gone)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-gone:
			gone = nil
			syscall.Kill(-os.Getpid(), syscall.SIGTERM)
			go func() {
				time.Sleep(3 * time.Second)
				killWhere(marked(0, procEnv, token), nil)
				syscall.Kill(-os.Getpid(), syscall.SIGKILL)
			}()
		case err := <-done:
			killWhere(marked(0, procEnv, token), nil)
			return exitLike(err)
		}
	}
}

// exitLike exits as the agent did: with its code, or by its signal.
func exitLike(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return 1
		}
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		signal.Reset(ws.Signal())
		syscall.Kill(os.Getpid(), ws.Signal())
		time.Sleep(time.Second) // the signal ends the keeper
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// keep wraps cmd in the keeper when there is one (`keeper... -- <agent
// argv>`, with a lifeline as file descriptor 3, a pipe whose other end
// only the node holds). It returns the node's end of the lifeline, which
// the caller keeps until the keeper has exited, and the keeper's, which
// the caller closes once cmd started.
func keep(cmd *exec.Cmd, argv, keeper []string) (node, child *os.File, err error) {
	if len(keeper) == 0 {
		return nil, nil, nil
	}
	// A missing agent is said at once, not by the keeper's exit.
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, nil, launchError(argv[0], err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	full := append(append(append([]string(nil), keeper...), "--"), argv...)
	cmd.Path, cmd.Args, cmd.Err = full[0], full, nil
	if p, err := exec.LookPath(full[0]); err == nil {
		cmd.Path = p
	}
	cmd.ExtraFiles = []*os.File{r}
	// The keeper, not a parent-death signal, ends the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return w, r, nil
}
