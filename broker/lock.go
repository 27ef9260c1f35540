//go:build unix

package broker

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/shoalfabric/shoal/schemas"
)

// lockFile is the file in a store dir that its server holds locked.
const lockFile = "shoal.lock"

// lockStore takes the store dir for this process, before the server opens
// anything in it: one store, one server. The lock is the kernel's, so it
// ends with the process however it ends. A store in use is refused with
// the pid of the process that holds it, and nothing in it is touched.
func lockStore(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInvalid, "store dir %s is not writable: %v (give another --store)", dir, unwrapPath(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := "another process"
		if pid := strings.TrimSpace(string(b)); pid != "" {
			holder = "process " + pid + describe(pid)
		}
		return nil, schemas.Errf(schemas.CodeInvalid, "store %s is in use by %s; one store serves one server (give this one another --store)", dir, holder)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// describe names a process by its program and the words before its first
// flag ("shoal up"), where the system says: never its flags, which may
// hold a token.
func describe(pid string) string {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	if err != nil || len(b) == 0 {
		return ""
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	words := []string{filepath.Base(args[0])}
	for _, a := range args[1:min(len(args), 3)] {
		if strings.HasPrefix(a, "-") || len(a) > 32 {
			break
		}
		words = append(words, a)
	}
	return " (" + strings.Join(words, " ") + ")"
}

// checkListeners makes sure the ports the server will listen on are free,
// before it opens its store: a port taken is refused in one line, with the
// store untouched.
func checkListeners(c Config) error {
	if c.DontListen {
		return nil
	}
	type listener struct {
		what, host string
		port       int
		flag       string // shoal up's flag that moves it
	}
	ls := []listener{{"client", c.Host, c.Port, "--port"}}
	if c.Cluster.Name != "" {
		ls = append(ls, listener{"route", or(c.Cluster.Host, c.Host), c.Cluster.Port, "--cluster-listen"})
	}
	if c.Leaf.Port != 0 {
		ls = append(ls, listener{"leaf", or(c.Leaf.Host, c.Host), c.Leaf.Port, "--leaf-listen"})
	}
	if c.Monitor.Port != 0 {
		ls = append(ls, listener{"monitoring", or(c.Monitor.Host, c.Host), c.Monitor.Port, "--monitor"})
	}
	for _, l := range ls {
		if l.port <= 0 {
			continue // a free one is picked
		}
		addr := net.JoinHostPort(l.host, strconv.Itoa(l.port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return schemas.Errf(schemas.CodeInvalid, "the %s port %s is in use by another process (another shoal up?); give this server another port (shoal up %s)", l.what, addr, l.flag)
			}
			return schemas.Errf(schemas.CodeInvalid, "cannot listen on the %s port %s: %v", l.what, addr, err)
		}
		ln.Close()
	}
	return nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// freeBytes is what the file system of dir has free for this process.
func freeBytes(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
