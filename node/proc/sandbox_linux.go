package proc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// minSandboxABI is the Landlock ABI the sandbox needs: file rules with
// truncation (3) and TCP connect rules (4).
const minSandboxABI = 4

// SandboxSupport says which kernel sandbox this machine gives agents
// ("landlock ABI 7"), or why it gives none.
func SandboxSupport() (string, error) {
	abi, err := ll.LandlockGetABIVersion()
	switch {
	case err != nil:
		return "", fmt.Errorf("this kernel has no Landlock (%v): the sandbox needs Linux 6.7 or later with Landlock enabled", err)
	case abi < minSandboxABI:
		return "", fmt.Errorf("this kernel's Landlock is ABI %d; the sandbox's network rules need ABI %d (Linux 6.7 or later)", abi, minSandboxABI)
	}
	return fmt.Sprintf("landlock ABI %d", abi), nil
}

// landlockConfig is the strictest configuration this kernel enforces.
func landlockConfig() (landlock.Config, error) {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return landlock.Config{}, err
	}
	switch {
	case abi >= 7:
		return landlock.V7, nil
	case abi == 6:
		return landlock.V6, nil
	case abi == 5:
		return landlock.V5, nil
	case abi == 4:
		return landlock.V4, nil
	}
	return landlock.Config{}, fmt.Errorf("the kernel's Landlock ABI %d is too old for the sandbox", abi)
}

// RunSandbox is the sandbox wrapper's main (SandboxArg): it confines
// itself with Landlock to the confinement in args[0], shuts the socket
// kinds Landlock cannot see, and execs args[2:] (after "--"). It returns
// only on failure: nothing runs unconfined.
func RunSandbox(args []string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "shoal sandbox: %v; the agent does not run\n", err)
		return 126
	}
	if len(args) < 3 || args[1] != "--" {
		return fail(errors.New("usage: shoal __sandbox <confinement> -- <command>"))
	}
	var c Confinement
	if err := json.Unmarshal([]byte(args[0]), &c); err != nil {
		return fail(fmt.Errorf("the confinement: %w", err))
	}
	argv := args[2:]
	PassNothingOn()
	if c.Namespaces {
		return fail(errors.New("a sandbox in namespaces of its own is started by its node, not through this wrapper"))
	}
	path, err := lookPath(argv[0])
	if err != nil {
		return fail(err)
	}
	if err := holdBeneath(&c); err != nil {
		return fail(err)
	}
	runtime.LockOSThread() // the filter and the exec on one thread
	if err := confine(c); err != nil {
		return fail(err)
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fail(fmt.Errorf("exec %s: %w", argv[0], err))
}

// holdBeneath opens the confinement's paths inside c.Beneath from it,
// through no symbolic link, and names each by its descriptor
// (/proc/self/fd/N, which the kernel resolves to what was opened, not
// to the name again), then enters c.Dir the same way. The descriptors
// close at the exec; the rules made from them stay.
func holdBeneath(c *Confinement) error {
	if c.Beneath == "" {
		return nil
	}
	root, err := unix.Open(c.Beneath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", c.Beneath, err)
	}
	defer unix.Close(root)
	held := map[string]string{}
	hold := func(p string) (string, error) {
		if h, ok := held[p]; ok {
			return h, nil
		}
		fd, err := openBeneath(root, c.Beneath, p)
		if err != nil || fd < 0 {
			return p, err
		}
		held[p] = "/proc/self/fd/" + strconv.Itoa(fd)
		return held[p], nil
	}
	for _, paths := range [][]string{c.Writable, c.Readable} {
		for i, p := range paths {
			h, err := hold(p)
			switch {
			case errors.Is(err, errMissing):
				h = "" // no rule: IgnoreIfMissing would skip it too
			case err != nil:
				return err
			}
			paths[i] = h
		}
	}
	c.Writable, c.Readable = slices.DeleteFunc(c.Writable, isEmpty), slices.DeleteFunc(c.Readable, isEmpty)
	if c.Dir == "" {
		return nil
	}
	dir, err := hold(c.Dir)
	if err != nil {
		return fmt.Errorf("the working directory %s: %w", c.Dir, err)
	}
	if dir == c.Dir {
		return fmt.Errorf("the working directory %s is not beneath %s", c.Dir, c.Beneath)
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("enter %s: %w", c.Dir, err)
	}
	return nil
}

// errMissing is a path beneath that is not there: a rule for it is
// skipped, as for any missing path, but a working directory must be.
var errMissing = errors.New("not there")

// openBeneath opens p from root (the directory beneath, whose path is
// beneath) as a path descriptor, through no symbolic link and never out
// of it, or returns -1 when p is not inside beneath.
func openBeneath(root int, beneath, p string) (int, error) {
	rel, err := filepath.Rel(beneath, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || !filepath.IsAbs(p) {
		return -1, nil
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for range 8 { // EAGAIN: a rename raced the walk; ask again
		fd, err := unix.Openat2(root, rel, &how)
		switch {
		case err == nil:
			return fd, nil
		case err == unix.ENOENT:
			return -1, errMissing
		case err == unix.ELOOP || err == unix.EXDEV:
			return -1, fmt.Errorf("%s is not a directory beneath %s but a link, or leads out of it (changed since it was checked?)", p, beneath)
		case err != unix.EAGAIN:
			return -1, fmt.Errorf("open %s beneath %s: %w", p, beneath, err)
		}
	}
	return -1, fmt.Errorf("open %s beneath %s: renamed again and again while it was opened", p, beneath)
}

func isEmpty(s string) bool { return s == "" }

func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s is not found", name)
}

// confine applies c to this process and everything it will start.
func confine(c Confinement) error {
	cfg, err := landlockConfig()
	if err != nil {
		return err
	}
	if err := dropPrivileges(); err != nil {
		return err
	}
	roDirs, roFiles := splitFiles(c.Readable)
	rwDirs, rwFiles := splitFiles(c.Writable)
	rules := []landlock.Rule{
		// Listing directories is allowed everywhere: tools walk up from
		// their directory (opencode looks for project files to the root).
		// Names show; no file's content outside the readable set does.
		landlock.PathAccess(ll.AccessFSReadDir, "/"),
		landlock.RODirs(roDirs...).IgnoreIfMissing(),
		landlock.ROFiles(roFiles...).IgnoreIfMissing(),
		landlock.RWDirs(rwDirs...).IgnoreIfMissing(),
		landlock.RWFiles(append(rwFiles, "/dev/null", "/dev/zero", "/dev/full")...).IgnoreIfMissing(),
		landlock.ROFiles("/dev/random", "/dev/urandom").IgnoreIfMissing(),
		// Terminals, for the tools that run commands in a pseudo-terminal
		// (gemini's shell): opening one and its ioctls.
		// The slave side of a new terminal comes from the master
		// (TIOCGPTPEER, as glibc's openpty does), so no rule opens the
		// other terminals in /dev/pts, a person's shell among them.
		landlock.RWFiles("/dev/tty", "/dev/ptmx").WithIoctlDev().IgnoreIfMissing(),
	}
	for _, p := range c.Ports {
		rules = append(rules, landlock.ConnectTCP(p))
	}
	for _, p := range c.Bind {
		rules = append(rules, landlock.BindTCP(p), landlock.ConnectTCP(p))
	}
	if err := cfg.Restrict(rules...); err != nil {
		return fmt.Errorf("restrict with Landlock: %w", err)
	}
	return filterSyscalls(len(c.Bind) > 0)
}

// Securebits (linux/securebits.h): uid 0 gains no capability at exec,
// and none of it can be undone.
const (
	secNoRoot             = 1 << 0
	secNoRootLocked       = 1 << 1
	secNoSetuidFixup      = 1 << 2
	secNoSetuidFixupLock  = 1 << 3
	secKeepCapsLocked     = 1 << 5
	secNoAmbientRaise     = 1 << 6
	secNoAmbientRaiseLock = 1 << 7
)

// dropPrivileges leaves this thread, and so what it execs, no capability
// at all: a node run as root would otherwise hand its agents root's
// powers (making device nodes, typing into other terminals, BPF), which
// Landlock does not take away. The bounding set goes first, then the
// securebits that keep uid 0 from regaining anything at exec, then the
// sets themselves. A node that is not root has nothing to drop but the
// sets, and may not touch the rest.
func dropPrivileges() error {
	last := 63
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EPERM && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clear the ambient capabilities: %w", err)
	}
	bits := secNoRoot | secNoRootLocked | secNoSetuidFixup | secNoSetuidFixupLock | secKeepCapsLocked | secNoAmbientRaise | secNoAmbientRaiseLock
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil && err != unix.EPERM {
		return fmt.Errorf("set securebits: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	return nil
}

// splitFiles sorts paths into directories and other files: a directory's
// rights (listing, making entries) cannot be granted on a file.
func splitFiles(paths []string) (dirs, files []string) {
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			files = append(files, p)
		} else {
			dirs = append(dirs, p)
		}
	}
	return dirs, files
}

// filterSyscalls installs a seccomp filter for what Landlock does not
// see:
//
//   - sockets: an internet socket may only be plain TCP (no UDP, no raw
//     sockets, no multipath TCP, which Landlock does not restrict); of the
//     other families only unix and netlink's route sockets are allowed
//     (no packet, vsock, XDP…); a send with MSG_FASTOPEN, which connects
//     without passing Landlock's connect check, is refused, and so is
//     listen() unless the agent was given a port to serve on;
//   - io_uring, which could make sockets and open files past the filter,
//     and openat2, whose arguments it cannot read (callers fall back to
//     openat, which it can);
//   - reaching into other processes: ptrace, process_vm_readv/writev and
//     pidfd_getfd (so no tool takes the CLI's own pipes, which carry its
//     events and answers), and pushing keystrokes into a terminal
//     (TIOCSTI, TIOCLINUX);
//   - the kernel's keyrings (keyctl, add_key, request_key), which a
//     process shares with its session, the node's among them;
//   - setuid and setgid bits, in a chmod, a created file's mode or a new
//     directory's: on a node run as root, a file the agent owns as root
//     would run as root for anyone, outside the sandbox too;
//   - new namespaces (unshare, setns, clone with a namespace flag;
//     clone3, whose flags it cannot read, answers ENOSYS so callers fall
//     back to clone).
func filterSyscalls(mayListen bool) error {
	const (
		deny   uint32 = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys uint32 = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		ok     uint32 = unix.SECCOMP_RET_ALLOW
		// offsets in struct seccomp_data: the low words of the arguments
		nr, arch                      = 0, 4
		arg0, arg1, arg2, arg3        = 16, 24, 32, 40
		msgFastOpen            uint32 = 0x20000000
		setID                  uint32 = unix.S_ISUID | unix.S_ISGID
		creating               uint32 = unix.O_CREAT | 0x400000 // O_CREAT, __O_TMPFILE
		newNamespaces          uint32 = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
			unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME
	)
	var f filter
	f.load(arch).ifNot(auditArch, deny)    // another system call ABI
	f.load(nr).ifAtLeast(0x40000000, deny) // x32 system calls
	for _, sc := range []uint32{unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
		unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD,
		unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_SETNS} {
		f.ifIs(sc, deny)
	}
	f.ifIs(unix.SYS_OPENAT2, enosys)
	f.ifIs(unix.SYS_CLONE3, enosys)
	if !mayListen {
		f.ifIs(unix.SYS_LISTEN, deny)
	}
	// One argument's bits refused: a flag set, a mode's setuid bits.
	type bits struct{ sc, arg, mask uint32 }
	checks := []bits{
		{unix.SYS_UNSHARE, arg0, newNamespaces}, {unix.SYS_CLONE, arg0, newNamespaces},
		{unix.SYS_FCHMOD, arg1, setID}, {unix.SYS_FCHMODAT, arg2, setID}, {unix.SYS_FCHMODAT2, arg2, setID},
		{unix.SYS_MKDIRAT, arg2, setID},
		// sendto(fd, buf, len, flags, …) and sendmmsg(fd, vec, n, flags):
		// flags are the fourth argument; sendmsg(fd, msg, flags) the third.
		{unix.SYS_SENDTO, arg3, msgFastOpen}, {unix.SYS_SENDMMSG, arg3, msgFastOpen}, {unix.SYS_SENDMSG, arg2, msgFastOpen},
	}
	for _, l := range legacyModeCalls {
		checks = append(checks, bits{l.sc, [...]uint32{arg0, arg1, arg2, arg3}[l.arg], setID})
	}
	for i, c := range checks {
		next := fmt.Sprintf("after-bits-%d", i)
		f.ifIsNot(c.sc, next)
		f.load(c.arg).ifBits(c.mask, deny)
		f.ret(ok)
		f.label(next)
		f.load(nr)
	}
	// A file created with setuid bits: openat(dfd, path, flags, mode), and
	// open(path, flags, mode) where there is one.
	opens := []struct{ sc, flags, mode uint32 }{{unix.SYS_OPENAT, arg2, arg3}}
	for _, l := range legacyOpenCalls {
		opens = append(opens, struct{ sc, flags, mode uint32 }{l.sc, [...]uint32{arg0, arg1, arg2, arg3}[l.flags], [...]uint32{arg0, arg1, arg2, arg3}[l.mode]})
	}
	for i, o := range opens {
		next, mode := fmt.Sprintf("after-open-%d", i), fmt.Sprintf("open-mode-%d", i)
		f.ifIsNot(o.sc, next)
		f.load(o.flags).ifBits(creating, mode)
		f.ret(ok)
		f.label(mode)
		f.load(o.mode).ifBits(setID, deny)
		f.ret(ok)
		f.label(next)
		f.load(nr)
	}
	// ioctl(fd, TIOCSTI or TIOCLINUX, …)
	f.ifIsNot(unix.SYS_IOCTL, "after-ioctl")
	f.load(arg1)
	f.ifIs(unix.TIOCSTI, deny)
	f.ifIs(unix.TIOCLINUX, deny)
	f.ret(ok)
	f.label("after-ioctl")
	f.load(nr)
	f.ifIsNot(unix.SYS_SOCKET, ok)
	f.load(arg0)
	f.ifIs(unix.AF_UNIX, ok)
	f.ifIs(unix.AF_INET, "inet")
	f.ifIs(unix.AF_INET6, "inet")
	f.ifIsNot(unix.AF_NETLINK, deny)
	f.load(arg2).ifNot(unix.NETLINK_ROUTE, deny) // interface lists, nothing more
	f.ret(ok)
	f.label("inet") // plain TCP only
	f.load(arg1).and(0xf).ifNot(unix.SOCK_STREAM, deny)
	f.load(arg2)
	f.ifIs(0, ok)
	f.ifIs(unix.IPPROTO_TCP, ok)
	f.ret(deny)
	prog, err := f.assemble()
	if err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// Landlock has set no_new_privs already; TSYNC puts every thread under
	// the filter.
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	return nil
}

// filter assembles a classic BPF seccomp program with named jump targets:
// a target is a label, or a return value (deny, allow), which is placed
// once at the end.
type filter struct {
	ins    []instruction
	labels map[string]int
}

type instruction struct {
	code   uint16
	k      uint32
	jt, jf any // string label, uint32 return value, or nil: the next one
}

const (
	bpfLoad = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfJset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfAnd  = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	bpfRet  = unix.BPF_RET | unix.BPF_K
)

func (f *filter) add(code uint16, k uint32, jt, jf any) *filter {
	f.ins = append(f.ins, instruction{code, k, jt, jf})
	return f
}

func (f *filter) load(off uint32) *filter            { return f.add(bpfLoad, off, nil, nil) }
func (f *filter) and(mask uint32) *filter            { return f.add(bpfAnd, mask, nil, nil) }
func (f *filter) ret(v uint32) *filter               { return f.add(bpfRet, v, nil, nil) }
func (f *filter) ifIs(v uint32, to any) *filter      { return f.add(bpfJeq, v, to, nil) }
func (f *filter) ifIsNot(v uint32, to any) *filter   { return f.add(bpfJeq, v, nil, to) }
func (f *filter) ifNot(v uint32, to any) *filter     { return f.ifIsNot(v, to) }
func (f *filter) ifAtLeast(v uint32, to any) *filter { return f.add(bpfJge, v, to, nil) }
func (f *filter) ifBits(mask uint32, to any) *filter { return f.add(bpfJset, mask, to, nil) }

func (f *filter) label(name string) {
	if f.labels == nil {
		f.labels = map[string]int{}
	}
	if _, dup := f.labels[name]; dup {
		panic("seccomp filter: label " + name + " placed twice")
	}
	f.labels[name] = len(f.ins)
}

// assemble resolves the targets: labels to their instruction, return
// values to a return placed after the program.
func (f *filter) assemble() ([]unix.SockFilter, error) {
	rets := map[uint32]int{}
	var tail []uint32
	for _, in := range f.ins {
		for _, t := range []any{in.jt, in.jf} {
			if v, ok := t.(uint32); ok {
				if _, seen := rets[v]; !seen {
					rets[v] = len(f.ins) + len(tail)
					tail = append(tail, v)
				}
			}
		}
	}
	out := make([]unix.SockFilter, 0, len(f.ins)+len(tail))
	for i, in := range f.ins {
		jump := func(t any) (uint8, error) {
			var to int
			switch t := t.(type) {
			case nil:
				return 0, nil
			case string:
				n, ok := f.labels[t]
				if !ok {
					return 0, fmt.Errorf("seccomp filter: no label %q", t)
				}
				to = n
			case uint32:
				to = rets[t]
			default:
				return 0, fmt.Errorf("seccomp filter: a jump to %v (%T)", t, t)
			}
			d := to - i - 1
			if d < 0 || d > 255 {
				return 0, fmt.Errorf("seccomp filter: a jump of %d", d)
			}
			return uint8(d), nil
		}
		jt, err := jump(in.jt)
		if err != nil {
			return nil, err
		}
		jf, err := jump(in.jf)
		if err != nil {
			return nil, err
		}
		out = append(out, unix.SockFilter{Code: in.code, Jt: jt, Jf: jf, K: in.k})
	}
	for _, v := range tail {
		out = append(out, unix.SockFilter{Code: bpfRet, K: v})
	}
	return out, nil
}

func capsetPtr[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }
