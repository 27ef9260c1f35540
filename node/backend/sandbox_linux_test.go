//go:build linux

package backend_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"golang.org/x/sys/unix"
)

// run starts argv as an agent's process would be, through the reaper and
// optionally confined, and returns what it printed.
func run(t *testing.T, spec backend.ProcessSpec) string {
	t.Helper()
	exe, _ := os.Executable()
	r, err := backend.StartReaper(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	spec.Reaper = r
	p, out, err := backend.StartProcess(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(out)
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the process did not end")
	}
	return string(b)
}

// A key given twice in an agent's environment means its last value,
// through the reaper as through os/exec.
func TestProcessEnvLastValueWins(t *testing.T) {
	t.Parallel()
	got := run(t, backend.ProcessSpec{Argv: []string{"/bin/sh", "-c", "echo $WHICH; env | grep -c ^WHICH="},
		Env: []string{"PATH=/usr/bin:/bin", "WHICH=first", "WHICH=last"}})
	if got != "last\n1\n" {
		t.Fatalf("the process saw %q", got)
	}
}

// Confined: a shell writes only where it may, reads nothing else of the
// file system's contents nor another process's environment, connects to
// no port it was not given (not with TCP Fast Open either) nor an
// abstract socket outside, makes no UDP, raw, multipath or vsock socket,
// no io_uring and no listener, signals no process outside, writes to no
// other terminal, and holds no capability, even as root; a daemon it
// forks is as confined.
func TestSandboxConfinesTheTree(t *testing.T) {
	t.Parallel()
	if _, err := backend.SandboxSupport(); err != nil {
		t.Fatalf("this machine cannot run the sandbox test: %v", err)
	}
	exe, _ := os.Executable()
	cwd, outside := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("decoy"), 0o644)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port it was not given: refused, not unanswered
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	abstract := fmt.Sprintf("@shoal-sandbox-test-%d", os.Getpid())
	ul, err := net.Listen("unix", abstract) // outside the sandbox: refused
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	pid := strconv.Itoa(os.Getpid())
	// Another terminal (a person's shell, say): its pty is not the agent's.
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	ptn, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	script := `
echo in > ok && echo wrote-inside
echo out > ` + outside + `/f 2>/dev/null || echo no-write-outside
cat ` + outside + `/secret 2>/dev/null || echo no-read-outside
ls ` + outside + ` >/dev/null 2>&1 && echo listed-outside
python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)' 2>/dev/null || echo no-udp
python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)' 2>/dev/null || echo no-mptcp
python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>/dev/null || echo no-raw
python3 -c 'import socket; s=socket.socket(); s.settimeout(2); s.connect(("127.0.0.1", ` + port + `))' 2>/dev/null || echo no-connect
python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect("\0` + abstract[1:] + `")' 2>/dev/null || echo no-abstract-socket
python3 -c 'import ctypes, sys; libc=ctypes.CDLL(None, use_errno=True); sys.exit(1 if libc.syscall(425, 1, ctypes.create_string_buffer(120)) < 0 else 0)' 2>/dev/null || echo no-io-uring
cat /proc/` + pid + `/environ >/dev/null 2>&1 || echo no-environ
python3 -c 'import socket; s=socket.socket(); s.sendto(b"x", 0x20000000, ("127.0.0.1", ` + port + `))' 2>/dev/null || echo no-fastopen
python3 -c 'import socket; socket.socket(40, socket.SOCK_STREAM)' 2>/dev/null || echo no-vsock
python3 -c 'import socket; s=socket.socket(); s.listen()' 2>/dev/null || echo no-listen
echo x > /dev/pts/` + strconv.Itoa(ptn) + ` 2>/dev/null || echo no-other-terminal
mknod dev c 1 3 2>/dev/null || echo no-mknod
grep -q '^CapEff:\s*0*$' /proc/$$/status && grep -q '^CapBnd:\s*0*$' /proc/$$/status && echo no-capabilities
kill -0 ` + pid + ` 2>/dev/null || echo no-signal
(setsid sh -c 'echo daemon > ` + outside + `/d' 2>/dev/null; echo daemon-tried) &
wait
sleep 0.5
`
	got := run(t, backend.ProcessSpec{Argv: []string{"/bin/sh", "-c", script}, Dir: cwd,
		Env:     []string{"PATH=/usr/bin:/bin"},
		Sandbox: &backend.Confinement{Exe: exe, Writable: []string{cwd}, Readable: backend.SystemReadable}})
	for _, want := range []string{"wrote-inside", "no-write-outside", "no-read-outside", "listed-outside", "no-udp", "no-mptcp", "no-raw", "no-connect",
		"no-abstract-socket", "no-io-uring", "no-environ", "no-signal", "no-fastopen", "no-vsock", "no-listen",
		"no-other-terminal", "no-mknod", "no-capabilities", "daemon-tried"} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("the confined shell did not say %s:\n%s", want, got)
		}
	}
	for _, f := range []string{"f", "d"} {
		if _, err := os.Stat(filepath.Join(outside, f)); !os.IsNotExist(err) {
			t.Errorf("%s was written outside: %v", f, err)
		}
	}
}
