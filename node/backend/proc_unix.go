//go:build unix

package backend

import (
	"fmt"
	"syscall"
)

// killGroup SIGKILLs every process left in the group led by pgid.
func killGroup(pgid int) {
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// KillGroup SIGKILLs a process group; the node uses it to reap agents a
// previous instance left behind.
func KillGroup(pgid int) error {
	if pgid <= 0 {
		return fmt.Errorf("no process group %d", pgid)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	return nil
}
