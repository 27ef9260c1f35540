//go:build linux && amd64

package proc

import "golang.org/x/sys/unix"

const auditArch = unix.AUDIT_ARCH_X86_64

// The system calls of this ABI that older ones have beside the *at ones:
// which argument is a mode (chmod(path, mode), mkdir(path, mode),
// creat(path, mode)), and open(path, flags, mode)'s flags and mode.
var (
	legacyModeCalls = []struct{ sc, arg uint32 }{{unix.SYS_CHMOD, 1}, {unix.SYS_MKDIR, 1}, {unix.SYS_CREAT, 1}}
	legacyOpenCalls = []struct{ sc, flags, mode uint32 }{{unix.SYS_OPEN, 1, 2}}
)
