//go:build darwin

package node

import "golang.org/x/sys/unix"

// memoryBytes is the machine's memory, from sysctl hw.memsize.
func memoryBytes() uint64 {
	n, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return 0
	}
	return n
}
