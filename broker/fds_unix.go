//go:build unix

package broker

import "syscall"

// openFileLimit is how many files the process may have open at once (Go
// raises the soft limit to the hard one as it starts), or 0 if unknown.
func openFileLimit() uint64 {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return 0
	}
	return lim.Cur
}
