//go:build linux

package proc

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts the child in its own process group and has the kernel
// SIGKILL it if the node dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// StartTime identifies a process incarnation, so a recycled pid is never
// mistaken for an agent: the start time in clock ticks since boot from
// /proc/<pid>/stat.
func StartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) is parenthesised and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	const startTimeField = 22 - 3 // fields after ")" start at field 3
	if len(fields) <= startTimeField {
		return "", fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return fields[startTimeField], nil
}

// socketPipe is a one-way connection like os.Pipe's, made of a unix
// socket pair: a sandboxed agent's standard streams are sockets, since a
// socket cannot be opened again through /proc/<pid>/fd, where a pipe can
// (a tool of the agent would otherwise write into its CLI's stdout, or
// read its stdin). Both ends are non-blocking for deadlines, as os.Pipe's
// are; the child's copy is made blocking by its own process start.
func socketPipe() (r, w *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	for _, fd := range fds {
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			return nil, nil, err
		}
	}
	unix.Shutdown(fds[0], unix.SHUT_WR)
	unix.Shutdown(fds[1], unix.SHUT_RD)
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

// closeRangeOnExec marks every descriptor from fd up close-on-exec in one
// call, where the kernel has close_range (5.11).
func closeRangeOnExec(fd uint) bool {
	return unix.CloseRange(fd, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil
}

// fionread asks how many bytes a pipe holds (FIONREAD, which Linux
// also calls TIOCINQ).
const fionread = unix.TIOCINQ
