//go:build linux

package proc_test

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

	"github.com/shoalfabric/shoal/node/proc"

	"github.com/shoalfabric/shoal/internal/proctest"
)

// run starts argv as an agent's process would be, through the reaper and
// optionally confined, and returns what it printed.
func run(t *testing.T, spec proc.ProcessSpec) string {
	t.Helper()
	out, err := tryRun(t, spec)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryRun is run for a process that may not start.
func tryRun(t *testing.T, spec proc.ProcessSpec) (string, error) {
	t.Helper()
	exe, _ := os.Executable()
	r, err := proc.StartReaper(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	spec.Reaper = r
	p, out, err := proc.StartProcess(spec)
	if err != nil {
		return "", err
	}
	b, _ := io.ReadAll(out)
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the process did not end")
	}
	if err := p.Err(); err != nil {
		t.Logf("the process ended: %v; its stderr: %s", err, p.StderrTail())
	}
	return string(b), nil
}

// A key given twice in an agent's environment means its last value,
// through the reaper as through os/exec.
func TestProcessEnvLastValueWins(t *testing.T) {
	t.Parallel()
	got := run(t, proc.ProcessSpec{Argv: []string{"/bin/sh", "-c", "echo $WHICH; env | grep -c ^WHICH="},
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
	bothKinds(t, confinesTheTree)
}

// bothKinds runs test as parallel subtests, Landlock alone and in
// namespaces of its own.
func bothKinds(t *testing.T, test func(t *testing.T, namespaces bool)) {
	for _, ns := range []bool{false, true} {
		name := "landlock"
		if ns {
			name = "namespaces"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, ns)
		})
	}
}

func confinesTheTree(t *testing.T, namespaces bool) {
	if _, err := proc.SandboxSupport(); err != nil {
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
	abstract := fmt.Sprintf("@shoal-sandbox-test-%d-%v", os.Getpid(), namespaces)
	ul, err := net.Listen("unix", abstract) // outside the sandbox: refused
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	pid := strconv.Itoa(os.Getpid())
	// Another terminal (a person's shell, say): its pty is not the agent's.
	_, ptn := proctest.PTY(t)
	script := `
echo in > ok && echo wrote-inside
echo out > ` + outside + `/f 2>/dev/null || echo no-write-outside
cat ` + outside + `/secret 2>/dev/null || echo no-read-outside
ls ` + outside + ` >/dev/null 2>&1 && echo listed-outside || echo not-listed-outside
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
[ -n "$(cat /proc/cmdline 2>/dev/null)" ] || echo no-kernel-cmdline
[ -n "$(cat /proc/keys 2>/dev/null)" ] || echo no-keys
grep -q '^Name:' /proc/$$/status && echo own-status
grep -q '^processor' /proc/cpuinfo && echo cpuinfo
grep -q '^Name:' /proc/self/status 2>/dev/null && echo child-status
(setsid sh -c 'echo daemon > ` + outside + `/d' 2>/dev/null; echo daemon-tried) &
wait
sleep 0.5
`
	got := run(t, proc.ProcessSpec{Argv: []string{"/bin/sh", "-c", script}, Dir: cwd,
		Env:     []string{"PATH=/usr/bin:/bin"},
		Sandbox: &proc.Confinement{Exe: exe, Writable: []string{cwd}, Readable: proc.SystemReadable, Namespaces: namespaces}})
	// Landlock lets directory names show everywhere; in namespaces of its
	// own, what is not named is not there at all.
	// A shell's children read their own /proc/<pid> only in namespaces of
	// their own (Landlock alone names the first process's).
	listed, child := "listed-outside", ""
	if namespaces {
		listed, child = "not-listed-outside", "child-status"
	}
	for _, want := range []string{"wrote-inside", "no-write-outside", "no-read-outside", listed, "no-udp", "no-mptcp", "no-raw", "no-connect",
		"no-abstract-socket", "no-io-uring", "no-environ", "no-signal", "no-fastopen", "no-vsock", "no-listen",
		"no-other-terminal", "no-mknod", "no-capabilities", "daemon-tried", "no-kernel-cmdline", "no-keys", "own-status", "cpuinfo", child} {
		if want != "" && !strings.Contains(got, want+"\n") {
			t.Errorf("the confined shell did not say %s:\n%s", want, got)
		}
	}
	if !namespaces && strings.Contains(got, "child-status\n") {
		t.Errorf("a child of the confined shell read its /proc/<pid>, which Landlock alone does not name:\n%s", got)
	}
	for _, f := range []string{"f", "d"} {
		if _, err := os.Stat(filepath.Join(outside, f)); !os.IsNotExist(err) {
			t.Errorf("%s was written outside: %v", f, err)
		}
	}
}

// The node's writes into a directory an agent may write follow nothing
// the agent planted: a symlink in the path or at the file is not
// followed, a hardlink to a file outside is replaced, not written
// through, and ".." is refused.
func TestWriteBeneathFollowsNothingPlanted(t *testing.T) {
	t.Parallel()
	root, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("untouched"), 0o644)
	os.Symlink(victim, filepath.Join(root, "link"))
	os.Symlink(outside, filepath.Join(root, "dirlink"))
	if err := os.Link(victim, filepath.Join(root, "hard")); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"link", "hard"} {
		if err := proc.WriteBeneath(root, rel, []byte("seeded"), 0o600); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if fi, err := os.Lstat(filepath.Join(root, rel)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s after the write: %v %v", rel, fi, err)
		}
	}
	if err := proc.WriteBeneath(root, "dirlink/x", []byte("seeded"), 0o600); err == nil {
		t.Error("a write through a planted directory symlink went through")
	}
	if err := proc.WriteBeneath(root, "../x", []byte("seeded"), 0o600); err == nil {
		t.Error("a write above the root went through")
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Fatalf("the file outside holds %q", b)
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); !os.IsNotExist(err) {
		t.Fatalf("a file was made outside: %v", err)
	}
}

// A sandboxed agent's own home is seeded with the settings and login at
// the top of the user's, not with the CLI's logs: the claude CLI keeps
// the prompts of every project in history.jsonl there.
func TestSeedHomeCopiesNoHistory(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "settings.json"), []byte(`{"theme":"dark"}`), 0o600)
	os.WriteFile(filepath.Join(src, ".credentials.json"), []byte(`{"k":"v"}`), 0o600)
	os.WriteFile(filepath.Join(src, "history.jsonl"), []byte(`{"display":"another project's prompt"}`+"\n"), 0o600)
	if err := proc.SeedHome(dst, src); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"settings.json", ".credentials.json"} {
		if _, err := os.Stat(filepath.Join(dst, name)); err != nil {
			t.Errorf("%s was not seeded: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "history.jsonl")); err == nil {
		t.Errorf("the user's prompt history was copied into the agent's home")
	}
}

// The node's reads from a directory an agent may write follow nothing
// the agent planted either, and read only a regular file of a bounded
// size (a FIFO does not hold them).
func TestReadBeneathFollowsNothingPlanted(t *testing.T) {
	t.Parallel()
	root, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("secret"), 0o600)
	os.Symlink(victim, filepath.Join(root, "link"))
	os.Symlink(outside, filepath.Join(root, "dirlink"))
	os.WriteFile(filepath.Join(root, "big"), make([]byte, 100), 0o600)
	os.Mkdir(filepath.Join(root, "sub"), 0o700)
	os.WriteFile(filepath.Join(root, "sub", "ok"), []byte("mine"), 0o600)
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"link", "dirlink/victim", "fifo", "big", "../x", "missing"} {
		if b, err := proc.ReadBeneath(root, rel, 64); err == nil {
			t.Errorf("ReadBeneath(%s) = %q; want a refusal", rel, b)
		}
	}
	if b, err := proc.ReadBeneath(root, "sub/ok", 64); err != nil || string(b) != "mine" {
		t.Errorf("ReadBeneath(sub/ok) = %q, %v", b, err)
	}
}

// A sandbox in namespaces of its own is one stage under the reaper: its
// init is the reaper's child, with no wrapper between. The node serves
// its edge: the agent reaches the port it was given on the node's
// loopback and the node's loopback reaches the agent's own server, a
// signal of the stop ladder reaches the agent through the init (until
// 2026-12-04 Landlock refused it: the init forwarded it from a thread of
// another domain, so a namespaced agent was always SIGKILLed at the
// ladder's end), and the edge's relays end with it (goleak, in TestMain).
func TestNamespacedSandboxIsOneStageWhoseEdgeTheNodeServes(t *testing.T) {
	if err := proc.NamespacesSupport(); err != nil {
		t.Fatalf("this machine cannot run the namespaces test: %v", err)
	}
	exe, _ := os.Executable()
	r, err := proc.StartReaper(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	given, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	go func() {
		for {
			c, err := given.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("from-the-node\n"))
			c.Close()
		}
	}()
	bind, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	gport := given.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf(`
import os, socket, signal
s = socket.create_connection(("127.0.0.1", %d), timeout=5)
print(s.makefile().readline().strip(), flush=True)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", %d)); srv.listen()
print("listening", flush=True)
c, _ = srv.accept(); c.sendall(b"from-the-agent\n"); c.close()
signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b"terminated\n"), os._exit(0)))
print("waiting", flush=True)
signal.pause()
`, gport, bind)
	cwd := t.TempDir()
	p, out, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{"python3", "-c", script}, Dir: cwd, Env: []string{"PATH=/usr/bin:/bin"}, Reaper: r,
		Sandbox: &proc.Confinement{Exe: exe, Writable: []string{cwd}, Readable: proc.SystemReadable, Ports: []uint16{uint16(gport)}, Bind: []uint16{bind}, Namespaces: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		t.Fatal(err)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID()))
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if ppid, _ := strconv.Atoi(fields[1]); ppid != r.PID() || !strings.Contains(string(cmdline), proc.SandboxInitArg) {
		t.Fatalf("the agent's process %d is %q, a child of %d: want the sandbox's init, a child of the reaper %d", p.PID(), cmdline, ppid, r.PID())
	}
	lines := make(chan string, 8)
	go func() {
		b := make([]byte, 0, 256)
		buf := make([]byte, 256)
		for {
			n, err := out.Read(buf)
			b = append(b, buf[:n]...)
			for {
				i := strings.IndexByte(string(b), '\n')
				if i < 0 {
					break
				}
				lines <- string(b[:i])
				b = b[i+1:]
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	next := func(want string) {
		t.Helper()
		select {
		case got := <-lines:
			if got != want {
				t.Fatalf("the agent said %q, want %q; its stderr: %s", got, want, p.StderrTail())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the agent did not say %q; its stderr: %s", want, p.StderrTail())
		}
	}
	next("from-the-node")
	next("listening")
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(bind))), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "from-the-agent\n" {
		t.Fatalf("the agent's server on the node's loopback answered %q", got)
	}
	next("waiting")
	p.Stop(t.Context(), []proc.Step{{Signal: syscall.SIGTERM, Wait: 10 * time.Second}})
	next("terminated")
	if err := p.Err(); err != nil {
		t.Fatalf("the agent did not end on its own after SIGTERM: %v; its stderr: %s", err, p.StderrTail())
	}
	out.Close()
}

// A CLI named by a link outside its install (the claude CLI's own
// installer puts ~/.local/bin/claude beside nothing of it, linking to
// ~/.local/share/claude/versions/<v>) runs sandboxed: the sandbox grants
// the install at its real path, and the command is run there.
func TestSandboxRunsACommandNamedByALink(t *testing.T) {
	t.Parallel()
	if _, err := proc.SandboxSupport(); err != nil {
		t.Fatalf("this machine cannot run the sandbox test: %v", err)
	}
	bothKinds(t, func(t *testing.T, ns bool) {
		if ns {
			if err := proc.NamespacesSupport(); err != nil {
				t.Fatalf("this machine cannot run the namespaces test: %v", err)
			}
		}
		install, bin, cwd := t.TempDir(), t.TempDir(), t.TempDir()
		cli := filepath.Join(install, "2.1.0")
		if err := os.WriteFile(cli, []byte("#!/bin/sh\necho ran \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(bin, "cli")
		if err := os.Symlink(cli, link); err != nil {
			t.Fatal(err)
		}
		exe, _ := os.Executable()
		readable := append([]string{proc.InstallRoot(link)}, proc.SystemReadable...)
		got := run(t, proc.ProcessSpec{Argv: []string{link, "a turn"}, Dir: cwd, Env: []string{"PATH=/usr/bin:/bin"},
			Sandbox: &proc.Confinement{Exe: exe, Writable: []string{cwd}, Readable: readable, Namespaces: ns}})
		if got != "ran a turn\n" {
			t.Errorf("the CLI named by a link printed %q, want %q", got, "ran a turn\n")
		}
	})
}

// A confinement held beneath a directory (a sandboxed agent's child, in
// a subdirectory of its parent's) gets the directory that is there, not
// where a link swapped in for it leads: the parent, which writes its
// directory, trades the subdirectory for a link to a directory outside
// as fast as the kernel renames while its children start. The sandbox
// made its rules and working directory by name, and a child came up
// writing outside.
func TestConfinementHoldsItsDirectoryBeneathWhileSwapped(t *testing.T) {
	t.Parallel()
	bothKinds(t, holdsBeneath)
}

func holdsBeneath(t *testing.T, namespaces bool) {
	if _, err := proc.SandboxSupport(); err != nil {
		t.Fatalf("this machine cannot run the sandbox test: %v", err)
	}
	exe, _ := os.Executable()
	family, outside := t.TempDir(), t.TempDir()
	sub, link := filepath.Join(family, "sub"), filepath.Join(family, "link")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	stop := proctest.Exchange(sub, link)
	started := 0
	for i := range 30 {
		// A child that finds a link where its directory was does not
		// start (in namespaces of its own, the node's start fails).
		got, _ := tryRun(t, proc.ProcessSpec{Argv: []string{"/bin/sh", "-c", "echo x > child-" + strconv.Itoa(i) + " && echo wrote"}, Dir: sub,
			Env: []string{"PATH=/usr/bin:/bin"},
			Sandbox: &proc.Confinement{Exe: exe, Writable: []string{sub}, Readable: proc.SystemReadable, Namespaces: namespaces,
				Beneath: family, Dir: sub}})
		if strings.Contains(got, "wrote") {
			started++
		}
	}
	stop()
	entries, _ := os.ReadDir(outside)
	for _, e := range entries {
		t.Errorf("a child wrote %s outside its family's directory", e.Name())
	}
	if started == 0 {
		t.Errorf("no child of 30 started and wrote in its directory")
	}
	t.Logf("%d of 30 children started (the others found a link where their directory was, and did not run)", started)
}
