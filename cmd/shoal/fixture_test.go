package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// upFixture is `shoal up` on ports of its own (no Kaimon bus), its local
// node "n" running the pinned claude CLI against a fake model, started and
// ready, with a client environment that reaches it.
type upFixture struct {
	t      *testing.T
	dir    string
	fake   *fakemodel.Server
	up     *shoalProc
	url    string   // the NATS URL clients dial
	client []string // the environment of a client
	said   []string // what `shoal up` printed until it was ready
}

// startCoordinator starts one; env is added to its environment and args
// to its command line (after --port -1 --mcp-listen 127.0.0.1:0 --no-bus
// and the claude CLI).
func startCoordinator(t *testing.T, env []string, args ...string) *upFixture {
	t.Helper()
	c := &upFixture{t: t, dir: t.TempDir(), fake: fakemodel.Start(t, fakemodel.Config{})}
	env = append(append(peers.ClaudeEnv(filepath.Join(c.dir, "claude"), c.fake.URL()), "XDG_CACHE_HOME="+c.dir+"/cache"), env...)
	c.up = startShoal(t, c.dir, env, append([]string{"up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", peers.Claude.Command(t)[0], "--node-name", "n"}, args...)...)
	for {
		l := c.up.waitLine("shoal: ")
		c.said = append(c.said, l)
		if strings.HasPrefix(l, "shoal: ready") {
			break
		}
	}
	c.url = c.printed("NATS listening on ")
	c.client = []string{"SHOAL_NATS=" + c.url}
	return c
}

// printed is what `shoal up` said after "shoal: "+prefix before it was
// ready; the test fails if it said no such thing.
func (c *upFixture) printed(prefix string) string {
	c.t.Helper()
	for _, l := range c.said {
		if v, ok := strings.CutPrefix(l, "shoal: "+prefix); ok {
			return v
		}
	}
	c.t.Fatalf("shoal up did not say %q; it said:\n%s", prefix, strings.Join(c.said, "\n"))
	return ""
}

// shoal runs a client command against the coordinator.
func (c *upFixture) shoal(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	return runShoal(c.t, c.t.TempDir(), c.client, args...)
}

// must runs a client command that must succeed and returns its output,
// trimmed.
func (c *upFixture) must(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.shoal(args...)
	if code != 0 {
		c.t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
	}
	return strings.TrimSpace(out)
}

// authPool is `shoal up --auth` (no local node, no bus) and one `shoal
// node` named far with credentials of its own, running the pinned claude
// CLI against a fake model; as is the environment of a caller with the
// credentials of the given role.
type authPool struct {
	dir, url string
	up       *shoalProc
	node     *shoalProc
	fake     *fakemodel.Server
	creds    map[string]string // by name: far, and the caller's
	as       []string
	upArgs   []string // shoal up's command line
}

// startAuthPool starts one for a caller of role (client, coordinator)
// named caller; upArgs are added to shoal up's command line.
func startAuthPool(t *testing.T, role, caller string, upArgs ...string) *authPool {
	t.Helper()
	p := &authPool{dir: t.TempDir(), creds: map[string]string{}, fake: fakemodel.Start(t, fakemodel.Config{})}
	authDir := filepath.Join(p.dir, "keys")
	for _, c := range [][2]string{{"node", "far"}, {role, caller}} {
		path := filepath.Join(p.dir, c[1]+".creds")
		if code, _, errOut := runShoal(t, p.dir, nil, "creds", c[0], c[1], "--out", path, "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
		p.creds[c[1]] = path
	}
	p.upArgs = append([]string{"up", "--auth", "--auth-dir", authDir, "--port", "-1",
		"--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", "2s"}, upArgs...)
	p.up = startShoal(t, p.dir, nil, p.upArgs...)
	p.url = strings.TrimPrefix(p.up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	p.up.waitLine("shoal: ready")
	home := p.nodeHome()
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), p.fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	p.node = startShoal(t, home, env, "node", "--nats", p.url, "--creds", p.creds["far"], "--claude", peers.Claude.Command(t)[0], "--stop-wait", "500ms")
	p.node.waitLine("shoal: node far joined")
	p.as = []string{"SHOAL_NATS=" + p.url, "SHOAL_CREDS=" + p.creds[caller]}
	return p
}

// restartUp stops shoal up with sig and starts it again as it was
// started (on a port of its own, given in upArgs, for the node to find it
// again).
func (p *authPool) restartUp(t *testing.T, sig syscall.Signal) {
	t.Helper()
	p.up.stop(sig)
	p.up = startShoal(t, p.dir, nil, p.upArgs...)
	p.up.waitLine("shoal: ready")
}

// nodeHome is the node's home: its files, and its claude CLI's.
func (p *authPool) nodeHome() string { return filepath.Join(p.dir, "far") }

// must runs a caller's command that must succeed and returns its output,
// trimmed.
func (p *authPool) must(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := runShoal(t, t.TempDir(), p.as, args...)
	if code != 0 {
		t.Fatalf("shoal %v: exit %d: %s%s", args, code, out, errOut)
	}
	return strings.TrimSpace(out)
}

// startConfNATS starts a NATS server, in this process, with the
// configuration in file conf: a deployment Shoal does not run. It returns
// once the server is ready, and shuts it down when the test ends.
func startConfNATS(t *testing.T, conf string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the NATS configuration %s does not load: %v", conf, err)
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return ns
}

// startShoalNATS starts a NATS deployment Shoal does not run, configured
// with `shoal creds server-config` (its keys in dir/keys, its store in
// dir/js), and writes the credentials of each role and name asked for to
// dir/<name>.creds.
func startShoalNATS(t *testing.T, dir string, creds ...[2]string) *server.Server {
	t.Helper()
	authDir := filepath.Join(dir, "keys")
	code, cfg, errOut := runShoal(t, dir, nil, "creds", "server-config", "--auth-dir", authDir)
	if code != 0 {
		t.Fatalf("server-config: %s", errOut)
	}
	conf := filepath.Join(dir, "nats.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:-1\nmax_payload: 8MB\njetstream { store_dir: %q }\n%s", filepath.Join(dir, "js"), cfg)), 0o600)
	ns := startConfNATS(t, conf)
	for _, c := range creds {
		if code, _, errOut := runShoal(t, dir, nil, "creds", c[0], c[1], "--out", filepath.Join(dir, c[1]+".creds"), "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
	}
	return ns
}
