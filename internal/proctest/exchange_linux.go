package proctest

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Exchange trades the names a and b (a directory and a link, say) as fast
// as the kernel renames, as an agent racing its node does, until the
// function it returns is called. It spins on a thread of its own at the
// lowest priority, so as not to starve the rest of a loaded machine.
func Exchange(a, b string) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		for {
			select {
			case <-quit:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
		}
	}()
	return func() { close(quit); <-done }
}
