//go:build !unix

package broker

// openFileLimit is 0 where the process's limit is not read.
func openFileLimit() uint64 { return 0 }
