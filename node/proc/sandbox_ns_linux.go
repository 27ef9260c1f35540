package proc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// The namespaced sandbox, around Landlock and seccomp. The node starts
// one stage of the shoal binary per agent, the init (SandboxInitArg), as
// the first process of new user, mount, pid, IPC, network, UTS and cgroup
// namespaces: it builds a root holding only what the confinement names,
// every mount nosuid and nodev, a private /dev, /tmp and /proc; brings
// loopback up; listens on the ports the agent may reach and hands each
// connection to the node over a unix socket pair (the edge); then gives
// up every capability, confines itself with Landlock and seccomp as the
// Landlock-only sandbox confines its agents, and starts the agent's
// program under that confinement. It forwards the stop ladder's signals,
// reaps whatever the agent leaves, and ends with it, which ends every
// process of the namespace however it detached.
//
// The node serves the edge itself (an edge, below): it dials its own
// loopback for each connection the init hands out, on the ports the agent
// may reach and no other, and hands into the sandbox the connections to
// the agent's own server ports. Each start of the shoal binary costs a
// turn some 10 ms before its main runs, so the init is the only stage:
// it starts the agent itself, and no wrapper stands between it and the
// node.

// namespaces probes once whether this machine gives the sandbox its own
// namespaces: unprivileged user namespaces with mount, pid, IPC and
// network ones in them.
var namespaces = sync.OnceValue(func() error {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = nsAttr()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("new user, mount, pid, IPC, network, UTS and cgroup namespaces cannot be made (%v)", err)
	}
	return nil
})

// nsAttr makes a child in new namespaces, in a process group of its own,
// its user namespace mapping the node's own uid and gid to themselves,
// with the capabilities its init needs there (and nowhere else).
func nsAttr() *syscall.SysProcAttr {
	uid, gid := os.Getuid(), os.Getgid()
	return &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC |
			unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
		AmbientCaps:                []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP},
		Setpgid:                    true,
		Pdeathsig:                  syscall.SIGKILL,
	}
}

// crossing is one connection handed across the sandbox's edge, over the
// socket pair between the node and the init: its port, and which way.
type crossing struct {
	Port uint16
	Out  bool // from inside to the node's loopback; false: from the node into the sandbox
}

// An edge is the node's side of one namespaced sandbox: the socket pair
// to its init, the node's loopback ports of the agent's own servers, and
// the list of what the init masks in /etc, found while the kernel makes
// the namespaces.
type edge struct {
	c      *Confinement
	ours   *net.UnixConn
	theirs *os.File // the init's end, its descriptor 3
	binds  []net.Listener
	masks  chan []masked // nil when /etc is not read; buffered, so its walk never waits
}

// newEdge prepares the start of argv in c's namespaces: the edge, and the
// init's command line.
func newEdge(c *Confinement, argv []string) (*edge, []string, error) {
	conf, err := json.Marshal(c)
	if err != nil {
		return nil, nil, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("the sandbox's edge: %w", err)
	}
	mine := os.NewFile(uintptr(pair[0]), "edge")
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		unix.Close(pair[1])
		return nil, nil, fmt.Errorf("the sandbox's edge: %w", err)
	}
	e := &edge{c: c, ours: conn.(*net.UnixConn), theirs: os.NewFile(uintptr(pair[1]), "edge-init")}
	// The node's side of the agent's own servers: each of its ports on the
	// node's loopback, taken before the agent starts so that one in use
	// is said at once.
	for _, port := range c.Bind {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		if err != nil {
			e.close()
			return nil, nil, fmt.Errorf("the agent's port %d on the node's loopback: %w", port, err)
		}
		e.binds = append(e.binds, ln)
	}
	if masksEtc(*c) {
		e.masks = make(chan []masked, 1)
		go func() { e.masks <- unreadable("/etc") }()
	}
	return e, append([]string{c.Exe, SandboxInitArg, string(conf), "--"}, argv...), nil
}

// serve is the edge once the init has started: the list of what to mask
// goes first, then the connections cross both ways until done is closed
// (the agent has ended), when the edge closes.
func (e *edge) serve(done <-chan struct{}) error {
	e.theirs.Close()
	if e.masks != nil {
		b, _ := json.Marshal(<-e.masks)
		if _, err := e.ours.Write(b); err != nil {
			e.close()
			return fmt.Errorf("the sandbox's list of what to mask: %w", err)
		}
	}
	for i, ln := range e.binds {
		go acceptInto(ln, e.ours, e.c.Bind[i])
	}
	go relayOut(e.ours, e.c.Ports)
	go func() {
		<-done
		e.close()
	}()
	return nil
}

// close ends the edge: the init's end if it is still here, the node's,
// and the listeners.
func (e *edge) close() {
	e.theirs.Close()
	e.ours.Close()
	for _, ln := range e.binds {
		ln.Close()
	}
}

// sendConn hands conn across the edge with what it is.
func sendConn(edge *net.UnixConn, conn *net.TCPConn, c crossing) error {
	f, err := conn.File()
	conn.Close()
	if err != nil {
		return err
	}
	defer f.Close()
	msg := make([]byte, 3)
	binary.BigEndian.PutUint16(msg, c.Port)
	if c.Out {
		msg[2] = 1
	}
	_, _, err = edge.WriteMsgUnix(msg, unix.UnixRights(int(f.Fd())), nil)
	return err
}

// recvConn takes a connection handed across the edge.
func recvConn(edge *net.UnixConn) (net.Conn, crossing, error) {
	msg, oob := make([]byte, 3), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := edge.ReadMsgUnix(msg, oob)
	switch {
	case err != nil:
		return nil, crossing{}, err
	case n == 0:
		return nil, crossing{}, io.EOF
	}
	var fds []int
	if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for i := range cmsgs {
			if got, err := unix.ParseUnixRights(&cmsgs[i]); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if n != 3 || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, crossing{}, fmt.Errorf("a crossing of %d bytes with %d connections", n, len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "crossing")
	defer f.Close()
	conn, err := net.FileConn(f)
	return conn, crossing{Port: binary.BigEndian.Uint16(msg), Out: msg[2] == 1}, err
}

// acceptInto hands the connections to port on the node's loopback into
// the sandbox.
func acceptInto(ln net.Listener, edge *net.UnixConn, port uint16) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if sendConn(edge, c.(*net.TCPConn), crossing{Port: port}) != nil {
			return
		}
	}
}

// relayOut dials the node's loopback for each connection the init hands
// out, on the ports the agent may reach and no other.
func relayOut(edge *net.UnixConn, ports []uint16) {
	for {
		conn, c, err := recvConn(edge)
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			if conn != nil {
				conn.Close()
			}
			if _, ok := err.(*net.OpError); ok {
				return // the edge broke
			}
			continue
		}
		if !c.Out || !slices.Contains(ports, c.Port) {
			conn.Close()
			continue
		}
		go func() {
			up, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(c.Port))))
			if err != nil {
				conn.Close()
				return
			}
			splice(conn, up)
		}()
	}
}

// splice copies both ways until both sides are done, closing each half as
// its sender ends.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if t, ok := dst.(interface{ CloseWrite() error }); ok {
			t.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go half(a, b)
	go half(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// RunSandboxInit is the sandbox's init (SandboxInitArg, stage 2). It
// returns only on failure; otherwise it exits with the agent's status.
func RunSandboxInit(args []string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "shoal sandbox: %v; the agent does not run\n", err)
		return 126
	}
	if len(args) < 3 || args[1] != "--" {
		return fail(errors.New("usage: shoal __sandbox-init <confinement> -- <command>"))
	}
	var c Confinement
	if err := json.Unmarshal([]byte(args[0]), &c); err != nil {
		return fail(fmt.Errorf("the confinement: %w", err))
	}
	if os.Getpid() != 1 {
		return fail(errors.New("the sandbox's init is not the first process of its namespace"))
	}
	ef := os.NewFile(3, "edge")
	PassNothingOn() // the edge is the init's and the node's alone
	ec, err := net.FileConn(ef)
	ef.Close()
	if err != nil {
		return fail(fmt.Errorf("the sandbox's edge: %w", err))
	}
	edge := ec.(*net.UnixConn)
	wd, _ := os.Getwd()
	if c.Dir != "" {
		wd = c.Dir // its name: where the node started this may be elsewhere by now
	}
	if err := buildRoot(c, wd, edge); err != nil {
		return fail(fmt.Errorf("the sandbox's file system: %w", err))
	}
	unix.Sethostname([]byte("shoal-sandbox"))
	if err := loopbackUp(); err != nil {
		return fail(fmt.Errorf("the sandbox's loopback: %w", err))
	}
	for _, port := range c.Ports {
		ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		if err != nil {
			return fail(fmt.Errorf("port %d inside the sandbox: %w", port, err))
		}
		go handOut(ln, edge, port)
	}
	go relayIn(edge, c.Bind)
	signals := make(chan os.Signal, 32)
	signal.Notify(signals, unix.SIGCHLD, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	// The agent, of the same uid, may neither trace this process nor open
	// what it holds through /proc.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail(err)
	}
	status, err := runConfined(ownProc(c), args[2:], signals)
	if err != nil {
		return fail(err)
	}
	os.Exit(status)
	return 0
}

// ownProc is the confinement Landlock gets inside the namespaces: the
// whole of /proc where the Landlock-only sandbox names /proc/self. The
// sandbox's /proc is its own pid namespace's, holding only the agent's
// processes and the init (which no one may trace or read the secrets of),
// and of the kernel's files privateProc has left only those named.
func ownProc(c Confinement) Confinement {
	c.Namespaces = false
	c.Readable = slices.Clone(c.Readable)
	for i, p := range c.Readable {
		if p == "/proc/self" {
			c.Readable[i] = "/proc"
		}
	}
	return c
}

// handOut hands each connection to port inside the sandbox to the node,
// which dials its loopback.
func handOut(ln net.Listener, edge *net.UnixConn, port uint16) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if sendConn(edge, c.(*net.TCPConn), crossing{Port: port, Out: true}) != nil {
			return
		}
	}
}

// relayIn dials the agent's own server inside for each connection the
// node hands in, on its ports and no other.
func relayIn(edge *net.UnixConn, ports []uint16) {
	for {
		conn, c, err := recvConn(edge)
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			if _, ok := err.(*net.OpError); ok {
				return // the edge broke
			}
			continue
		}
		if c.Out || !slices.Contains(ports, c.Port) {
			conn.Close()
			continue
		}
		go func() {
			in, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(c.Port))))
			if err != nil {
				conn.Close()
				return
			}
			splice(conn, in)
		}()
	}
}

// reap is the init's loop: it reaps every child (the agent's orphans come
// to it), forwards signals to the agent, and returns the agent's status
// once it has ended. The init's exit ends everything left in the
// namespace.
func reap(pid int, signals chan os.Signal) int {
	for {
		for {
			var ws unix.WaitStatus
			wpid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if wpid <= 0 || err != nil {
				break
			}
			if wpid == pid {
				if ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ws.ExitStatus()
			}
		}
		if s := <-signals; s != unix.SIGCHLD {
			unix.Kill(pid, s.(syscall.Signal))
		}
	}
}

// runConfined starts argv confined by c, from a thread that has given up
// every capability (the bounding set, the ambient set and the securebits
// that would let uid 0 regain them, then the capability sets of every
// thread of this process) and then confines the whole init with Landlock
// and seccomp: the agent inherits both, and the init needs nothing they
// take. It reaps until the agent ends (reap) and returns its status.
//
// The same thread forwards the signals: each thread that restricts itself
// gets a Landlock domain of its own, and Landlock lets a process signal
// only its own domain and those beneath it, so only the thread the agent
// was started from, whose domain it inherited, may signal it (a signal
// from another of the init's threads is refused, and the stop ladder's
// SIGTERM would never reach the agent).
func runConfined(c Confinement, argv []string, signals chan os.Signal) (int, error) {
	type outcome struct {
		status int
		err    error
	}
	ch := make(chan outcome, 1)
	go func() {
		// Never unlocked: this thread's credentials differ from the
		// others', so the runtime destroys it when the goroutine ends.
		runtime.LockOSThread()
		if err := dropAllThreads(); err != nil {
			ch <- outcome{err: fmt.Errorf("drop the init's capabilities: %w", err)}
			return
		}
		path, err := lookPath(argv[0])
		if err != nil {
			ch <- outcome{err: err}
			return
		}
		if err := confine(c); err != nil {
			ch <- outcome{err: err}
			return
		}
		pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}, Sys: &syscall.SysProcAttr{}})
		if err != nil {
			ch <- outcome{err: fmt.Errorf("exec %s: %w", argv[0], err)}
			return
		}
		ch <- outcome{status: reap(pid, signals)}
	}()
	r := <-ch
	return r.status, r.err
}

// dropAllThreads takes this thread's bounding and ambient sets, locks the
// securebits, and empties the capability sets of every thread.
func dropAllThreads() error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			break
		}
		if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return err
	}
	bits := secNoRoot | secNoRootLocked | secKeepCapsLocked | secNoAmbientRaise | secNoAmbientRaiseLock
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	// Every thread of this process (psx works with and without cgo, as
	// Landlock's library does).
	if _, _, e := psx.Syscall3(unix.SYS_CAPSET, capsetPtr(&hdr), capsetPtr(&none[0]), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// loopbackUp brings the network namespace's loopback up.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// The sandbox's file system, built on a tmpfs: the host stays reachable
// under oldRoot while it is built, then is detached.
const (
	stageDir = "/tmp"
	oldRoot  = "/oldroot"
	newRoot  = "/newroot"
)

// devNodes are the device nodes a sandbox's /dev holds, bound from the
// host's (a user namespace may make none).
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// procReadOnly are the kernel's knobs in a sandbox's /proc, read-only
// where the confinement names them.
var procReadOnly = []string{"sys", "sysrq-trigger", "irq", "bus"}

// buildRoot makes the sandbox's root and moves into it, at cwd.
func buildRoot(c Confinement, cwd string, edge *net.UnixConn) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	// What lies beneath c.Beneath is opened now, from it, through no
	// link, and bound from what was opened (holdBeneath's reason).
	held := map[string]int{}
	defer func() {
		for _, fd := range held {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	if c.Beneath != "" {
		root, err := unix.Open(c.Beneath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", c.Beneath, err)
		}
		for _, p := range append(slices.Clone(c.Writable), c.Readable...) {
			if _, ok := held[p]; ok {
				continue
			}
			fd, err := openBeneath(root, c.Beneath, p)
			switch {
			case errors.Is(err, errMissing) && p != c.Dir:
				held[p] = -1 // not there: nothing to bind
			case err != nil:
				unix.Close(root)
				return err
			case fd >= 0:
				held[p] = fd
			}
		}
		unix.Close(root)
		if fd := held[c.Dir]; c.Dir != "" && fd <= 0 {
			return fmt.Errorf("the working directory %s is not beneath %s", c.Dir, c.Beneath)
		}
	}
	if err := mount("tmpfs", stageDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k"); err != nil {
		return err
	}
	for _, d := range []string{oldRoot, newRoot} {
		if err := os.Mkdir(stageDir+d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Chdir(stageDir); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."+oldRoot); err != nil {
		return fmt.Errorf("pivot_root into the staging root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := mount("tmpfs", newRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return err
	}
	if err := os.WriteFile("/empty", nil, 0o444); err != nil {
		return err
	}
	if err := os.Mkdir("/emptydir", 0o555); err != nil {
		return err
	}

	type step struct {
		dst  string
		prio int
		do   func() error
	}
	var steps []step
	add := func(dst string, prio int, do func() error) { steps = append(steps, step{dst, prio, do}) }
	add("/tmp", 0, func() error {
		if err := os.MkdirAll(newRoot+"/tmp", 0o755); err != nil {
			return err
		}
		return mount("tmpfs", newRoot+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777")
	})
	add("/dev", 0, privateDev)
	add("/proc", 0, func() error { return privateProc(c.Readable) })
	bind := func(p string, rw bool) func() error {
		if fd, ok := held[p]; ok {
			if fd < 0 {
				return func() error { return nil }
			}
			return func() error { return bindHeld(fd, p, rw) }
		}
		return func() error { return bindIn(p, rw) }
	}
	for _, p := range c.Readable {
		if isSystemView(p) {
			continue // the private /dev and /proc
		}
		add(p, 1, bind(p, false))
	}
	for _, p := range c.Writable {
		add(p, 1, bind(p, true))
	}
	// What only the node's user could read of the system's configuration
	// (password hashes, host keys, sudoers) stays unread, as if empty.
	if masksEtc(c) {
		add("/etc", 2, func() error { return maskUnreadable(edge) })
	}
	sort.SliceStable(steps, func(i, j int) bool {
		if di, dj := strings.Count(steps[i].dst, "/"), strings.Count(steps[j].dst, "/"); di != dj {
			return di < dj
		}
		return steps[i].prio < steps[j].prio
	})
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("%s: %w", s.dst, err)
		}
	}
	// Nothing may be made beside what is named.
	for _, p := range []string{newRoot + "/dev", newRoot} {
		if err := setattr(p, false, unix.MOUNT_ATTR_RDONLY); err != nil {
			return err
		}
	}
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the node's root: %w", err)
	}
	old, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(old)
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root into the sandbox's root: %w", err)
	}
	if err := unix.Fchdir(old); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the staging root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if cwd != "" {
		err := unix.Chdir(cwd)
		if fd, ok := held[c.Dir]; ok && c.Dir != "" {
			// Held: it must be entered, and be what was held (a bind
			// made elsewhere by a swap on the way would leave the name
			// to something else).
			if err == nil && !sameFile(".", fd) {
				err = errors.New("it is not the directory held")
			}
			if err != nil {
				return fmt.Errorf("enter %s: %w", cwd, err)
			}
		}
	}
	return nil
}

// sameFile says whether path and fd are the same file.
func sameFile(path string, fd int) bool {
	var a, b unix.Stat_t
	return unix.Stat(path, &a) == nil && unix.Fstat(fd, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino
}

// isSystemView reports whether a readable path is one of the kernel's
// views the sandbox gives privately (its own /dev and /proc).
func isSystemView(p string) bool {
	return p == "/dev" || strings.HasPrefix(p, "/dev/") || p == "/proc" || strings.HasPrefix(p, "/proc/")
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", src, dst, err)
	}
	return nil
}

// setattr adds mount attributes, recursively or not.
func setattr(path string, recursive bool, attr uint64) error {
	var flags uint
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, path, flags, &unix.MountAttr{Attr_set: attr}); err != nil {
		return fmt.Errorf("set the attributes of %s: %w", path, err)
	}
	return nil
}

// bindIn binds a host path (as the node sees it) at the same path in the
// sandbox's root, nosuid and nodev, read-only unless rw. A path that is a
// symlink is made a symlink again; one that is missing is skipped.
func bindIn(p string, rw bool) error {
	host, err := resolveParents(p)
	if err != nil {
		return nil // missing: nothing to bind
	}
	src, dst := filepath.Join(oldRoot, host), filepath.Join(newRoot, p)
	st, err := os.Lstat(src)
	if err != nil {
		return nil
	}
	if st.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if _, err := os.Lstat(dst); err == nil {
			return nil
		}
		return os.Symlink(target, dst)
	}
	if err := mountPoint(dst, st.IsDir()); err != nil {
		return err
	}
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !rw {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	return setattr(dst, true, attr)
}

// bindHeld binds what fd holds (opened by name p before the node's root
// moved to oldRoot) at p in the sandbox's root, as bindIn binds: through
// its descriptor's magic link in the node's /proc, which the kernel
// follows to what was opened.
//
// The mount point is made and opened from the sandbox's root through no
// link (the way to it may pass through a directory bound from the node,
// which the agent's parent writes), the tree is cloned from the held
// descriptor, given its attributes while detached, and moved onto the
// mount point's descriptor: no name is looked up again.
func bindHeld(fd int, p string, rw bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	target, err := mountPointBeneath(p, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	if err != nil {
		return err
	}
	defer unix.Close(target)
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("clone %s: %w", p, err)
	}
	defer unix.Close(tree)
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !rw {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
		return fmt.Errorf("set the attributes of %s: %w", p, err)
	}
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	return nil
}

// mountPointBeneath makes p under the sandbox's root (a directory, or
// an empty file when not dir) and returns a path descriptor of it, each
// component opened from the one before through no link.
func mountPointBeneath(p string, dir bool) (int, error) {
	cur, err := unix.Open(newRoot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	parts := strings.Split(strings.Trim(filepath.Clean(p), "/"), "/")
	for i, name := range parts {
		last := i == len(parts)-1
		how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		if !last || dir {
			how.Flags |= unix.O_DIRECTORY
		}
		next, err := unix.Openat2(cur, name, &how)
		if err == unix.ENOENT {
			if !last || dir {
				err = unix.Mkdirat(cur, name, 0o755)
			} else {
				var f int
				if f, err = unix.Openat(cur, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644); err == nil {
					unix.Close(f)
				}
			}
			if err == nil || err == unix.EEXIST {
				next, err = unix.Openat2(cur, name, &how)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("the mount point %s, at %s: %w", p, name, err)
		}
		cur = next
	}
	return cur, nil
}

// resolveParents resolves the symlinks of every component of p but the
// last, as the host has them.
func resolveParents(p string) (string, error) {
	if p == "/" {
		return p, nil
	}
	d, err := filepath.EvalSymlinks(filepath.Join(oldRoot, filepath.Dir(p)))
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(oldRoot, d)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("%s leaves the node's root", p)
	}
	return filepath.Join("/", rel, filepath.Base(p)), nil
}

// mountPoint makes an empty directory or file at p to mount on.
func mountPoint(p string, dir bool) error {
	if dir {
		return os.MkdirAll(p, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		if _, serr := os.Stat(p); serr == nil {
			return nil
		}
		return err
	}
	return f.Close()
}

// privateDev gives the sandbox a /dev of its own: the harmless device
// nodes, a fresh devpts instance (no other terminal is in it), /dev/shm.
func privateDev() error {
	d := newRoot + "/dev"
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	if err := mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	for _, n := range devNodes {
		if err := mountPoint(d+"/"+n, false); err != nil {
			return err
		}
		if err := mount(oldRoot+"/dev/"+n, d+"/"+n, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := setattr(d+"/"+n, false, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return err
		}
	}
	if err := os.Mkdir(d+"/pts", 0o755); err != nil {
		return err
	}
	if err := mount("devpts", d+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	for link, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd",
		"stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, d+"/"+link); err != nil {
			return err
		}
	}
	if err := os.Mkdir(d+"/shm", 0o755); err != nil {
		return err
	}
	return mount("tmpfs", d+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777")
}

// privateProc mounts a /proc of the sandbox's own pid namespace. Of the
// kernel's files and directories in it (those that are not a process's)
// only the ones readable names stay, its knobs read-only; the others are
// covered, as if empty: the kernel's command line, its symbols and
// memory, the keys of the node's session, the machine's disks. It must
// come while the node's /proc is still reachable (the kernel lets a
// namespace mount a proc only then).
func privateProc(readable []string) error {
	p := newRoot + "/proc"
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	if err := mount("proc", p, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name, sp := e.Name(), p+"/"+e.Name()
		if _, err := strconv.Atoi(name); err == nil || e.Type()&os.ModeSymlink != 0 {
			continue // a process, or self, thread-self, mounts, net: the reader's own
		}
		switch {
		case !slices.Contains(readable, "/proc/"+name):
			over := "/empty"
			if e.IsDir() {
				over = "/emptydir"
			}
			if err := mount(over, sp, "", unix.MS_BIND, ""); err != nil {
				return err
			}
		case slices.Contains(procReadOnly, name):
			if err := mount(sp, sp, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return err
			}
			if err := setattr(sp, true, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
				return err
			}
		}
	}
	return nil
}

// maskUnreadable covers, in the sandbox's /etc, every file and directory
// that not everyone may read on the host (/etc/shadow, host keys,
// sudoers): a node run as root would otherwise hand its agents what only
// root reads.
// The node finds them (unreadable) while the kernel makes the namespaces
// and the init starts, and hands the list across the edge before
// anything else; the init covers each.
func maskUnreadable(edge *net.UnixConn) error {
	buf := make([]byte, 1<<20)
	n, err := edge.Read(buf)
	if err != nil {
		return fmt.Errorf("the list of what to mask: %w", err)
	}
	var list []masked
	if err := json.Unmarshal(buf[:n], &list); err != nil {
		return fmt.Errorf("the list of what to mask: %w", err)
	}
	for _, m := range list {
		over := "/empty"
		if m.Dir {
			over = "/emptydir"
		}
		if err := mount(over, filepath.Join(newRoot, m.Path), "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	return nil
}

// masked is a path that not everyone may read: a file, or a directory.
type masked struct {
	Path string `json:"p"`
	Dir  bool   `json:"d,omitempty"`
}

// unreadable lists what beneath root not everyone may read: directories
// not everyone may list and enter (whose contents it does not walk), and
// regular files not everyone may read. Symlinks are not followed.
func unreadable(root string) []masked {
	var list []masked
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == root {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Mode()&os.ModeSymlink != 0 {
			return nil
		}
		mode := info.Mode().Perm()
		switch {
		case d.IsDir() && mode&0o005 != 0o005:
			list = append(list, masked{Path: path, Dir: true})
			return filepath.SkipDir
		case info.Mode().IsRegular() && mode&0o004 == 0:
			list = append(list, masked{Path: path})
		}
		return nil
	})
	return list
}

// masksEtc says whether the init masks /etc, and so whether the node
// sends it the list first.
func masksEtc(c Confinement) bool { return slices.Contains(c.Readable, "/etc") }

// NamespacesSupport says why the sandbox cannot put agents in namespaces
// of their own on this machine, or nil when it can.
func NamespacesSupport() error { return namespaces() }
