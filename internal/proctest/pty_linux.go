package proctest

import (
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// PTY opens a new pseudo-terminal, unlocked, and returns its master side
// and its number (its other side is /dev/pts/<n>); the master closes when
// the test ends.
func PTY(tb testing.TB) (master *os.File, n int) {
	tb.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		tb.Fatal(err)
	}
	if n, err = unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN); err != nil {
		tb.Fatal(err)
	}
	return ptmx, n
}
