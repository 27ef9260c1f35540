package bridge

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// peerProcess names the process at the other end of a unix socket, as
// the kernel recorded it when the peer connected.
func peerProcess(c net.Conn) []any {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return nil
	}
	return []any{"peer-pid", cred.Pid, "peer-uid", cred.Uid}
}
