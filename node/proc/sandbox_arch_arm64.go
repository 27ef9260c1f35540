//go:build linux && arm64

package proc

import "golang.org/x/sys/unix"

const auditArch = unix.AUDIT_ARCH_AARCH64

// This ABI has only the *at system calls: no chmod, mkdir, creat or open
// to filter beside them.
var (
	legacyModeCalls []struct{ sc, arg uint32 }
	legacyOpenCalls []struct{ sc, flags, mode uint32 }
)
