package backend

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
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
	return landlock.Config{}, fmt.Errorf("Landlock ABI %d is too old for the sandbox", abi)
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
	path, err := lookPath(argv[0])
	if err != nil {
		return fail(err)
	}
	runtime.LockOSThread() // the filter and the exec on one thread
	if err := confine(c); err != nil {
		return fail(err)
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fail(fmt.Errorf("exec %s: %w", argv[0], err))
}

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
		// Terminals, for the tools that run commands in a pseudo-terminal
		// (gemini's shell): opening one and its ioctls.
		landlock.RWFiles("/dev/tty", "/dev/ptmx").WithIoctlDev().IgnoreIfMissing(),
		landlock.RWDirs("/dev/pts").WithIoctlDev().IgnoreIfMissing(),
	}
	for _, p := range c.Ports {
		rules = append(rules, landlock.ConnectTCP(p))
	}
	for _, p := range c.Bind {
		rules = append(rules, landlock.BindTCP(p), landlock.ConnectTCP(p))
	}
	if err := cfg.Restrict(rules...); err != nil {
		return fmt.Errorf("Landlock: %w", err)
	}
	return shutSockets()
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

// shutSockets installs a seccomp filter for what Landlock's TCP rules do
// not see: an internet socket may only be plain TCP (no UDP, no raw
// sockets, no multipath TCP, which Landlock does not restrict), packet
// sockets are refused, and so is io_uring, which could make sockets past
// the filter. Unix sockets and the rest are untouched.
func shutSockets() error {
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		and  = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
		deny = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		ok   = unix.SECCOMP_RET_ALLOW
		// offsets in struct seccomp_data
		nr, arch = 0, 4
		arg0     = 16 // domain
		arg1     = 24 // type
		arg2     = 32 // protocol
	)
	prog := []unix.SockFilter{
		{Code: ldW, K: arch},
		{Code: jeq, Jt: 1, K: auditArch},
		{Code: ret, K: deny}, // another syscall ABI: refused
		{Code: ldW, K: nr},
		{Code: jge, Jt: 0, Jf: 1, K: 0x40000000},
		{Code: ret, K: deny}, // x32 syscalls: refused
		{Code: jeq, Jt: 0, Jf: 1, K: unix.SYS_IO_URING_SETUP},
		{Code: ret, K: deny},
		{Code: jeq, Jt: 1, Jf: 0, K: unix.SYS_SOCKET},
		{Code: ret, K: ok},
		{Code: ldW, K: arg0},
		{Code: jeq, Jt: 4, Jf: 0, K: unix.AF_INET},
		{Code: jeq, Jt: 3, Jf: 0, K: unix.AF_INET6},
		{Code: jeq, Jt: 1, Jf: 0, K: unix.AF_PACKET},
		{Code: ret, K: ok},
		{Code: ret, K: deny},
		// an internet socket: plain TCP only
		{Code: ldW, K: arg1},
		{Code: and, K: 0xf},
		{Code: jeq, Jt: 1, Jf: 0, K: unix.SOCK_STREAM},
		{Code: ret, K: deny},
		{Code: ldW, K: arg2},
		{Code: jeq, Jt: 2, Jf: 0, K: 0},
		{Code: jeq, Jt: 1, Jf: 0, K: unix.IPPROTO_TCP},
		{Code: ret, K: deny},
		{Code: ret, K: ok},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// Landlock has set no_new_privs already; TSYNC puts every thread under
	// the filter.
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	return nil
}
