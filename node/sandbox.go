package node

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// sandboxing is what the node can do for sandboxed agents: the kernel's
// mechanism, or why there is none.
type sandboxing struct {
	kernel     string // "namespaces, landlock ABI 7"; "" when the node cannot sandbox
	why        string // why it cannot
	namespaces bool   // agents get namespaces of their own around Landlock
	nsWhy      string // why they do not
}

// SandboxNamespaces begins the kernel mechanism of a node whose sandboxed
// agents get namespaces of their own around Landlock and seccomp.
const SandboxNamespaces = schemas.SandboxNamespaces

// detectSandbox finds what this node can confine agents with: the
// kernel's Landlock, and a shoal binary to confine them through.
func detectSandbox(cfg Config) sandboxing {
	if cfg.Reaper == "" {
		return sandboxing{why: "the node has no shoal binary to confine agents with (node.Config.Reaper)"}
	}
	kernel, err := proc.SandboxSupport()
	if err != nil {
		return sandboxing{why: err.Error()}
	}
	if cfg.SandboxKind == schemas.SandboxLandlock {
		return sandboxing{kernel: kernel, nsWhy: "the node gives Landlock and seccomp alone (its sandbox kind is landlock)"}
	}
	if err := proc.NamespacesSupport(); err != nil {
		return sandboxing{kernel: kernel, nsWhy: err.Error()}
	}
	return sandboxing{kernel: SandboxNamespaces + ", " + kernel, namespaces: true}
}

// commonEnv are the variables every sandboxed agent keeps of its node's
// environment, beside what its backend names and what Shoal sets for it:
// what any program needs to run (its paths, its home, its locale and
// terminal, where its certificates are).
var commonEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "COLORTERM",
	"TZ", "XDG_*", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "SHOAL_AGENT_*", "SHOAL_NODE",
	"SHOAL_PARENT_PID", "SHOAL_PERMITS_*", "SHOAL_PROC", "TMPDIR", "TMP", "TEMP", "HTTP_PROXY", "HTTPS_PROXY",
	"http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"}

// sandboxWanted decides whether an open runs sandboxed: the open says, or
// the node's mode does. It refuses what the node cannot do or its mode
// forbids, before anything is claimed.
func (h *Host) sandboxWanted(req schemas.OpenRequest) (bool, error) {
	mode := h.cfg.Sandbox
	want := mode == schemas.SandboxOn || mode == schemas.SandboxRequired
	if req.Sandbox != nil {
		want = *req.Sandbox
	}
	if req.SandboxKind != "" {
		switch {
		case req.Sandbox != nil && !*req.Sandbox:
			return false, schemas.Errf(schemas.CodeInvalid, "sandbox_kind %s asks for a sandbox, and sandbox is false", req.SandboxKind)
		case req.SandboxKind != schemas.SandboxLandlock && req.SandboxKind != schemas.SandboxNamespaces:
			return false, schemas.Errf(schemas.CodeInvalid, "sandbox_kind %q: want landlock or namespaces", req.SandboxKind)
		case h.sandbox.kernel != "" && !schemas.SandboxGives(h.sandbox.kernel, req.SandboxKind):
			return false, schemas.Errf(schemas.CodeUnavailable, "node %s cannot put agents in namespaces of their own: %s", h.cfg.Name, h.sandbox.nsWhy)
		}
		want = true
	}
	switch {
	case !want && mode == schemas.SandboxRequired:
		return false, schemas.Errf(schemas.CodeInvalid, "node %s runs every agent sandboxed (--sandbox=required); open without sandbox: false", h.cfg.Name)
	case want && h.sandbox.kernel == "":
		return false, schemas.Errf(schemas.CodeUnavailable, "node %s cannot sandbox agents: %s", h.cfg.Name, h.sandbox.why)
	case !want && len(req.SandboxNet) > 0:
		return false, schemas.Errf(schemas.CodeInvalid, "sandbox_net names hosts a sandboxed agent may reach; this agent is not sandboxed")
	}
	return want, nil
}

// confinement is what a sandboxed agent's processes get: the confinement
// the sandbox applies, the environment that points them at their proxy
// and temp directory, the policy its record and stream show, and what to
// undo when the agent ends.
type confinement struct {
	conf   *proc.Confinement
	env    []string
	policy *schemas.SandboxPolicy
	mcpURL string // the agent's way to the MCP endpoint, through its proxy
	end    func()
}

// confine prepares the sandbox of one agent: its private temp directory,
// its proxy, and the paths and ports the kernel will allow.
func (h *Host) confine(ctx context.Context, be backend.Backend, spec backend.Spec, net_ []string, readable ...string) (*confinement, error) {
	cf, ok := be.(backend.Confiner)
	if !ok {
		return nil, schemas.Errf(schemas.CodeUnavailable, "node %s cannot sandbox %s agents", h.cfg.Name, be.Kind())
	}
	needs, err := cf.SandboxNeeds(spec)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	cwd, err := filepath.EvalSymlinks(spec.CWD)
	if spec.Beneath != "" {
		// Resolved already, inside Beneath: resolving it again by name
		// now would follow a link swapped in since; the sandbox opens it
		// from Beneath through no link.
		cwd, err = spec.CWD, nil
		if !schemas.Within(spec.Beneath, cwd) {
			return nil, schemas.Errf(schemas.CodeForbidden, "agent cwd %s is outside %s, which it is held beneath", cwd, spec.Beneath)
		}
	}
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInvalid, "agent cwd: %v", err)
	}
	// What the node runs or reads as itself may not lie in what the
	// agent writes: its own binary (the sandbox's wrapper, the reaper),
	// its files, the CLI's install and configuration, an MCP
	// configuration the node reads to start the agent's next life.
	// Each is checked as named and as resolved: a link inside the
	// directory, pointing out, is the agent's to point elsewhere.
	type guard struct{ path, what string }
	guarded := []guard{{h.cfg.Reaper, "the node's own binary"}, {h.cfg.Dir, "the node's files"}, {spec.MCPConfig, "its MCP configuration, which the node reads"}}
	for _, r := range needs.Runs {
		guarded = append(guarded, guard{r, "what the node runs or reads outside the sandbox"})
	}
	for _, gd := range guarded {
		g, what := gd.path, gd.what
		if g == "" {
			continue
		}
		named := filepath.Clean(g)
		real, err := filepath.EvalSymlinks(g)
		if err != nil {
			real = named
		}
		for _, p := range []string{named, real} {
			if schemas.Within(cwd, p) || schemas.Within(filepath.Clean(spec.CWD), p) {
				return nil, schemas.Errf(schemas.CodeForbidden, "a sandboxed agent may not work in %s on node %s: it holds %s (%s), which the agent could rewrite for the node or the next agent to run unconfined", spec.CWD, h.cfg.Name, p, what)
			}
		}
	}
	tmp := filepath.Join(h.cfg.Dir, "tmp", spec.AgentID)
	os.RemoveAll(tmp) // a previous life's
	writable := proc.Compact(append([]string{cwd, tmp}, needs.Writable...))
	made := writable
	if spec.Beneath != "" {
		made = writable[1:] // cwd is there already, opened from Beneath, not made by name
	}
	if err := proc.EnsureDirs(made...); err != nil {
		return nil, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	hosts := append(slices.Clone(needs.Hosts), net_...)
	for _, p := range needs.Bind { // its own server, which it may reach through the proxy
		hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(int(p)), "localhost:"+strconv.Itoa(int(p)))
	}
	// The MCP endpoint is reached only through the proxy, which sends
	// the agent's own id and token whatever the agent puts in a request:
	// a sandboxed agent cannot call Shoal's tools as anyone else, or as
	// no agent at all (which would pass by the door's rules).
	var route *mcpRoute
	mcpURL := ""
	if spec.MCP.URL != "" {
		u, err := url.Parse(spec.MCP.URL)
		if err != nil || u.Host == "" {
			os.RemoveAll(tmp)
			return nil, schemas.Errf(schemas.CodeInvalid, "the MCP endpoint %q is not a URL", spec.MCP.URL)
		}
		route = &mcpRoute{url: u, agentID: spec.AgentID, token: spec.MCP.Token}
	}
	px, err := startProxy(ctx, hosts, route, h.log.With("agent", spec.AgentID))
	if err != nil {
		os.RemoveAll(tmp)
		return nil, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	if route != nil {
		mcpURL = "http://" + px.addr() + route.url.EscapedPath()
	}
	ports := append([]uint16{px.port()}, needs.Ports...)
	readable = proc.Compact(append(append(slices.Clone(proc.SystemReadable), needs.Readable...), readable...))
	// What it writes it reads too.
	if err := h.readsNothingSecret(append(slices.Clone(readable), writable...)); err != nil {
		px.close()
		os.RemoveAll(tmp)
		return nil, err
	}
	proxyURL := "http://" + px.addr()
	return &confinement{
		conf: &proc.Confinement{Exe: h.cfg.Reaper, Writable: writable, Readable: readable, Ports: ports, Bind: needs.Bind,
			Namespaces: h.sandbox.namespaces, Env: append(slices.Clone(commonEnv), needs.Env...), Beneath: spec.Beneath, Dir: dirBeneath(spec.Beneath, cwd)},
		env: []string{"TMPDIR=" + tmp, "TMP=" + tmp, "TEMP=" + tmp,
			"HTTP_PROXY=" + proxyURL, "HTTPS_PROXY=" + proxyURL, "http_proxy=" + proxyURL, "https_proxy=" + proxyURL,
			"ALL_PROXY=" + proxyURL, "all_proxy=" + proxyURL, "NO_PROXY=", "no_proxy="},
		policy: &schemas.SandboxPolicy{Kernel: h.sandbox.kernel, Writable: writable, Readable: readable, Net: px.allow, Proxy: px.addr()},
		mcpURL: mcpURL,
		end: func() {
			px.close()
			os.RemoveAll(tmp)
		},
	}, nil
}

// readsNothingSecret refuses a sandbox that would let its agent read
// what the node keeps from agents: its files (every agent's MCP token),
// its credentials, the home directory, Shoal's data and configuration.
// A readable path is a directory the kernel lets the agent read whole:
// a CLI installed next to the node's credentials, or a script in the
// home directory, would give it them. Each is checked as named and as
// resolved.
func (h *Host) readsNothingSecret(readable []string) error {
	secrets := append([]string{h.cfg.Dir}, h.cfg.Unreadable...)
	for _, s := range secrets {
		if s == "" || !filepath.IsAbs(s) {
			continue
		}
		named := filepath.Clean(s)
		real, err := filepath.EvalSymlinks(s)
		if err != nil {
			real = named
		}
		for _, r := range readable {
			for _, p := range []string{named, real} {
				if schemas.Within(r, p) {
					return schemas.Errf(schemas.CodeForbidden, "node %s cannot sandbox this agent: its sandbox would let it read %s, which holds %s, kept from agents (its credentials, its files, the home directory or Shoal's data); install the CLI, or put its script, in a directory of its own, and keep credentials out of the system's directories every sandboxed agent reads, such as /etc and /opt", h.cfg.Name, r, p)
				}
			}
		}
	}
	return nil
}

// dirBeneath is the working directory a confinement held beneath enters
// as it holds its paths, "" for one not held.
func dirBeneath(beneath, cwd string) string {
	if beneath == "" {
		return ""
	}
	return cwd
}

// checkSandboxMode refuses a node mode the node cannot keep.
func checkSandboxMode(cfg Config, sb sandboxing) error {
	switch cfg.Sandbox {
	case schemas.SandboxOff:
	case schemas.SandboxOn, schemas.SandboxRequired:
		if sb.kernel == "" {
			return fmt.Errorf("--sandbox=%s: this node cannot sandbox agents: %s", cfg.Sandbox, sb.why)
		}
	default:
		return fmt.Errorf("--sandbox %q: want off, on or required", cfg.Sandbox)
	}
	switch cfg.SandboxKind {
	case "", schemas.SandboxNamespaces, schemas.SandboxLandlock:
	default:
		return fmt.Errorf("--sandbox-kind %q: want namespaces or landlock", cfg.SandboxKind)
	}
	return nil
}
