package proc

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// SandboxArg is the argument that runs a shoal binary as the sandbox
// wrapper: `shoal __sandbox <confinement> -- <argv>` confines itself, then
// execs argv, which every process it starts inherits (RunSandbox).
const SandboxArg = "__sandbox"

// SandboxInitArg runs a shoal binary as the first process of a sandboxed
// agent's namespaces (RunSandboxInit, Linux).
const SandboxInitArg = "__sandbox-init"

// Confinement is what the kernel confines a sandboxed agent's processes
// to: where they may write, what else they may read, and the TCP ports
// they may connect to (the node's proxy for the agent and the
// coordinator's MCP endpoint). Everything else of the file system and
// every other connect is refused.
type Confinement struct {
	// Exe is the shoal binary that confines and then execs the agent.
	Exe      string   `json:"-"`
	Writable []string `json:"writable"`
	Readable []string `json:"readable"`
	Ports    []uint16 `json:"ports"`
	Bind     []uint16 `json:"bind,omitempty"`
	// Namespaces puts the tree in namespaces of its own around Landlock
	// and seccomp (user, mount, pid, IPC, network, UTS): a root that holds
	// only what is named, its own /dev, /tmp and /proc, and a network
	// with only loopback, whose Ports lead to the node's loopback and
	// whose Bind ports the node's loopback leads to.
	Namespaces bool `json:"namespaces,omitempty"`
	// Env names the environment variables the tree gets (a name, or a
	// prefix ending in "*"); the node's others stay behind.
	Env []string `json:"-"`
	// Beneath, when set, is a directory the paths inside it are held
	// beneath: each is opened from it through no symbolic link, and the
	// rule (or the bind) is made from what was opened, not from the
	// name again. A sandboxed agent's child works in its parent's
	// directory, which the parent writes: between the node's checks and
	// the sandbox being made, the parent could swap the child's
	// directory for a link to anywhere. Dir, the working directory, is
	// then entered the same way.
	Beneath string `json:"beneath,omitempty"`
	Dir     string `json:"dir,omitempty"`
}

// SystemReadable are the system's directories a sandboxed agent reads:
// its programs, libraries and configuration, and the kernel's views. The
// user's home, /tmp and /run are not among them, and of /proc only the
// machine's own files and the agent's CLI process: the directories of
// other processes (their environment, memory maps, command lines) are
// not, since Landlock's ptrace rule does not cover every file there.
// "/proc/self" is resolved by the Landlock-only wrapper, so it names the
// process that becomes the CLI; in namespaces of its own the agent reads all of its
// pid namespace's /proc instead, whose processes are its own and whose
// kernel files not named here are covered. Of /dev only the harmless nodes are given (null, zero,
// full, random, urandom, a terminal of its own): no other terminal, no
// disk.
var SystemReadable = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys",
	"/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/loadavg", "/proc/uptime", "/proc/version",
	"/proc/filesystems", "/proc/swaps", "/proc/sys"}

// FreePort is a loopback TCP port nothing listens on now, for a sandboxed
// agent's own server: the sandbox lets it bind that port and no other.
func FreePort() (uint16, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port), nil
}

// URLHost is the host:port of a URL, for a sandbox's proxy to let
// through; "" when the URL has no host.
func URLHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	return u.Hostname()
}

// HomeDir is $HOME in env.
func HomeDir(env []string) string { return EnvValue(env, "HOME") }

// XDGDir is an XDG base directory in env ($XDG_DATA_HOME, say), or its
// default under $HOME.
func XDGDir(env []string, name, dflt string) string {
	if d := EnvValue(env, name); d != "" {
		return d
	}
	if h := HomeDir(env); h != "" {
		return filepath.Join(h, dflt)
	}
	return ""
}

// Wrap is argv run under the sandbox wrapper (Landlock and seccomp; not
// namespaces), for a program the node runs confined itself: it inherits
// the environment it is given, not c.Env.
func (c *Confinement) Wrap(argv []string) ([]string, error) {
	if c.Namespaces {
		return nil, fmt.Errorf("a confinement in namespaces of its own is made by its node, not by the wrapper")
	}
	return c.wrap(argv)
}

// wrap puts argv under the sandbox wrapper.
func (c *Confinement) wrap(argv []string) ([]string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return append([]string{c.Exe, SandboxArg, string(b), "--"}, argv...), nil
}

// InstallRoot is the directory a CLI is installed in, for a sandbox to
// let it read: for a package under node_modules, the directory that holds
// node_modules (the whole installed tree); otherwise the executable's own
// directory. Symlinks are resolved.
func InstallRoot(exe string) string {
	if p, err := exec.LookPath(exe); err == nil {
		exe = p
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	if i := strings.Index(exe, string(filepath.Separator)+"node_modules"+string(filepath.Separator)); i > 0 {
		return exe[:i]
	}
	return filepath.Dir(exe)
}

// EnsureDirs creates the directories a sandboxed CLI writes in, so the
// kernel can grant them: a rule needs an existing path. A path that
// exists, a file among them, is left as it is.
func EnsureDirs(dirs ...string) error {
	for _, d := range dirs {
		if _, err := os.Lstat(d); err == nil {
			continue
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("the sandbox's directory %s: %w", d, err)
		}
	}
	return nil
}

// Compact drops paths that are empty or repeated.
func Compact(paths []string) []string {
	var out []string
	for _, p := range paths {
		if p == "" {
			continue
		}
		p = filepath.Clean(p)
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// SeedHome makes dst and copies into it the regular files at the top of
// src (a CLI's settings and login), afresh; src may be missing. The
// agent works on the copies: the user's own are neither written nor read
// from inside the sandbox. dst is the agent's to write, so nothing it
// planted there (a symlink, a hardlink to a file outside) is written
// through (WriteBeneath). Logs are not copied (*.jsonl: the claude CLI
// keeps every project's prompts in history.jsonl there), nor is a file
// past 16 MiB, nor one whose name matches a pattern of skip
// (filepath.Match); such a file already in dst (copied by a node of an
// earlier version, or written there by the agent) is removed.
func SeedHome(dst, src string, skip ...string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("the agent's own %s: %w", dst, err)
	}
	skipped := func(name string) bool {
		return slices.ContainsFunc(skip, func(p string) bool {
			ok, _ := filepath.Match(p, name)
			return ok
		})
	}
	if len(skip) > 0 {
		have, err := os.ReadDir(dst)
		if err != nil {
			return fmt.Errorf("the agent's own %s: %w", dst, err)
		}
		for _, e := range have {
			if skipped(e.Name()) && !e.IsDir() {
				if err := os.Remove(filepath.Join(dst, e.Name())); err != nil {
					return fmt.Errorf("the agent's own %s: %w", dst, err)
				}
			}
		}
	}
	if src == "" {
		return nil
	}
	entries, err := os.ReadDir(src)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", src, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".jsonl") || skipped(e.Name()) {
			continue
		}
		if fi, err := e.Info(); err != nil || fi.Size() > 16<<20 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return fmt.Errorf("read %s: %w", src, err)
		}
		if err := WriteBeneath(dst, e.Name(), b, 0o600); err != nil {
			return fmt.Errorf("the agent's own %s: %w", dst, err)
		}
	}
	return nil
}
