//go:build linux

package backend

import (
	"fmt"
	"os"
	"strings"
	"syscall"
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
