//go:build darwin

package proc

import (
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts the child in its own process group. macOS has no
// parent-death signal; a node that dies is covered by the reaping of
// pids.json when it starts again.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// StartTime identifies a process incarnation: its start time from
// sysctl kern.proc.pid.
func StartTime(pid int) (string, error) {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		return "", err
	}
	tv := kp.Proc.P_starttime
	return strconv.FormatInt(int64(tv.Sec), 10) + "." + strconv.FormatInt(int64(tv.Usec), 10), nil
}

// socketPipe is os.Pipe here: there is no sandbox on macOS, whose agents'
// streams it would keep from being opened again.
func socketPipe() (r, w *os.File, err error) { return os.Pipe() }

// closeRangeOnExec is Linux's; macOS marks descriptors one by one.
func closeRangeOnExec(uint) bool { return false }

// fionread asks how many bytes a pipe holds (sys/filio.h's FIONREAD,
// which golang.org/x/sys/unix does not name for darwin).
const fionread = 0x4004667f
