package schemas

import (
	"net"
	"slices"
	"strings"
)

// Sandbox modes a node runs in (shoal node --sandbox).
const (
	// SandboxOff runs agents unconfined unless their open asks for the
	// sandbox.
	SandboxOff = "off"
	// SandboxOn sandboxes every agent unless its open says sandbox false.
	SandboxOn = "on"
	// SandboxRequired sandboxes every agent and refuses an open that says
	// sandbox false.
	SandboxRequired = "required"
)

// Sandbox kinds, weakest first: what a node's sandbox gives its agents.
const (
	// SandboxLandlock is Landlock and seccomp around the agent's tree.
	SandboxLandlock = "landlock"
	// SandboxNamespaces adds namespaces of the agent's own: a root holding
	// only its policy's paths, a private /dev, /tmp and /proc, its own pid
	// namespace (its end ends every process), a network of loopback only.
	SandboxNamespaces = "namespaces"
)

// SandboxGives reports whether a node's sandbox (its record's Sandbox,
// e.g. "namespaces, landlock ABI 7") is of kind or stronger.
func SandboxGives(sandbox, kind string) bool {
	switch kind {
	case "", SandboxLandlock:
		return sandbox != ""
	case SandboxNamespaces:
		return strings.HasPrefix(sandbox, SandboxNamespaces)
	}
	return false
}

// SandboxPolicy is what a sandboxed agent's whole process tree is
// confined to, by the kernel: the agent record and the first status event
// of its life carry it.
type SandboxPolicy struct {
	// Kernel names the mechanism, e.g. "landlock ABI 7".
	Kernel string `json:"kernel"`
	// Writable are the directories (and files) the tree may write: the
	// agent's cwd, its private temp directory, its CLI's state.
	Writable []string `json:"writable"`
	// Readable are those it may read besides: the system, the CLI's
	// install, the files its node wrote for it.
	Readable []string `json:"readable"`
	// Net are the hosts (host or host:port) its proxy lets through: the
	// model API, the coordinator's MCP endpoint, the open's sandbox_net.
	Net []string `json:"net"`
	// Proxy is the loopback address of that proxy, the only place besides
	// the MCP endpoint the tree may connect to.
	Proxy string `json:"proxy"`
}

// NetAllows reports whether a sandbox's host list (sandbox_net) lets host
// (host or host:port) through, as its proxy would: names in any case, a
// bare host meaning the web's ports, 443 and 80.
func NetAllows(list []string, host string) bool {
	host = strings.ToLower(strings.TrimSpace(host))
	h, port, err := net.SplitHostPort(host)
	return slices.ContainsFunc(list, func(e string) bool {
		e = strings.ToLower(e)
		if err != nil { // a bare host: the web's ports
			return e == host || e == host+":443" && slices.Contains(list, host+":80")
		}
		return e == host || (e == h && (port == "443" || port == "80"))
	})
}
