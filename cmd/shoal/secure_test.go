package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/tlstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A coordinator with authentication and TLS: a node with its own
// credentials and a leaf node behind "NAT" join it, a client drives an
// agent on each, an observer replays but cannot drive, and anything
// without the right credentials or certificate is refused with an error
// that says what to do.
func TestSecuredPool(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authDir := filepath.Join(dir, "keys")
	ca := tlstest.NewCA(t, "fabric")
	srv := ca.Issue(t, "coordinator")
	creds := map[string]string{}
	for _, c := range [][2]string{{"node", "box"}, {"node", "mac"}, {"client", "cli"}, {"observer", "eyes"}} {
		path := filepath.Join(dir, c[1]+".creds")
		if code, _, errOut := runShoal(t, dir, nil, "creds", c[0], c[1], "--out", path, "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
		creds[c[1]] = path
	}
	if code, _, errOut := runShoal(t, dir, nil, "creds", "node", "box", "--out", creds["box"], "--auth-dir", authDir); code != 2 || !strings.Contains(errOut, "give --force") {
		t.Errorf("overwriting credentials: %d %q", code, errOut)
	}

	up := startShoal(t, dir, nil, "up", "--auth", "--auth-dir", authDir, "--port", "-1", "--leaf-listen", "127.0.0.1:-1",
		"--tls-cert", srv.Cert, "--tls-key", srv.Key, "--tls-ca", ca.File,
		"--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", "2s")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	leafURL := strings.TrimPrefix(up.waitLine("shoal: leaf nodes connect to "), "shoal: leaf nodes connect to ")
	up.waitLine("shoal: ready")
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("the coordinator listens on %s, not TLS", url)
	}

	fake := fakemodel.Start(t, fakemodel.Config{})
	claude := peers.Claude.Command(t)[0]
	node := func(name string, args ...string) {
		home := filepath.Join(dir, name)
		env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
		all := append([]string{"node", "--creds", creds[name], "--tls-ca", ca.File, "--claude", claude, "--stop-wait", "500ms"}, args...)
		startShoal(t, home, env, all...).waitLine("shoal: node " + name + " joined")
	}
	node("box", "--nats", url)
	node("mac", "--leaf", leafURL)

	as := func(who string, args ...string) (int, string, string) {
		env := []string{"SHOAL_NATS=" + url, "SHOAL_TLS_CA=" + ca.File}
		if who != "" {
			env = append(env, "SHOAL_CREDS="+creds[who])
		}
		return runShoal(t, t.TempDir(), env, args...)
	}
	must := func(who string, args ...string) string {
		t.Helper()
		code, out, errOut := as(who, args...)
		if code != 0 {
			t.Fatalf("shoal %v as %s: exit %d: %s%s", args, who, code, out, errOut)
		}
		return strings.TrimSpace(out)
	}
	var nodes struct {
		Nodes []schemas.NodeRecord `json:"nodes"`
	}
	poll.Until(t, 20*time.Second, "both nodes are listed", func() bool {
		json.Unmarshal([]byte(must("cli", "nodes", "--json")), &nodes)
		return len(nodes.Nodes) == 2
	})
	for _, name := range []string{"box", "mac"} {
		var rep schemas.OpenReply
		json.Unmarshal([]byte(must("cli", "open", "--json", "--node", name, t.TempDir())), &rep)
		if rep.Node != name {
			t.Fatalf("open on %s: %+v", name, rep)
		}
		if out := must("cli", "run", rep.AgentID, "Say ok."); out != "ok" {
			t.Errorf("run on %s printed %q", name, out)
		}
		if out := must("eyes", "tail", "--no-follow", "--json", rep.AgentID); !strings.Contains(out, `"result"`) || !strings.Contains(out, `Say ok.`) {
			t.Errorf("the observer's replay of %s:\n%s", name, out)
		}
		if out := must("eyes", "output", rep.AgentID); out != "ok" {
			t.Errorf("the observer's output of %s: %q", name, out)
		}
		code, _, errOut := as("eyes", "send", rep.AgentID, "Do something.")
		if code == 0 || !strings.Contains(errOut, "may only observe") {
			t.Errorf("an observer's send: %d %q", code, errOut)
		}
		must("cli", "close", rep.AgentID)
	}

	refusals := []struct {
		what string
		code int
		err  string
		run  func() (int, string, string)
	}{
		{"no credentials", 2, "requires credentials: give --creds", func() (int, string, string) { return as("", "ls") }},
		{"no CA", 2, "does not trust: give --tls-ca", func() (int, string, string) {
			return runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + creds["cli"]}, "ls")
		}},
		{"a node's credentials for a client", 2, "are a node's", func() (int, string, string) { return as("box", "ls") }},
		{"a client's credentials for a node", 2, "not a node", func() (int, string, string) {
			return runShoal(t, t.TempDir(), nil, "node", "--nats", url, "--tls-ca", ca.File, "--creds", creds["cli"])
		}},
		{"a node under another name", 2, "are for node box, not other", func() (int, string, string) {
			return runShoal(t, t.TempDir(), nil, "node", "--nats", url, "--tls-ca", ca.File, "--creds", creds["box"], "--name", "other")
		}},
		// A leaf node tried these again for ever, saying why only in its
		// log (outside review).
		{"a leaf node with no CA", 2, "presents a certificate this machine does not trust: give --tls-ca", func() (int, string, string) {
			return runShoal(t, t.TempDir(), nil, "node", "--leaf", leafURL, "--creds", creds["mac"])
		}},
		{"a leaf node given the client port", 2, "is the hub's port for clients, not for leaf nodes", func() (int, string, string) {
			return runShoal(t, t.TempDir(), nil, "node", "--leaf", url, "--tls-ca", ca.File, "--creds", creds["mac"])
		}},
	}
	for _, r := range refusals {
		code, _, errOut := r.run()
		if code != r.code || !strings.Contains(errOut, r.err) {
			t.Errorf("%s: exit %d, %q; want exit %d and %q", r.what, code, errOut, r.code, r.err)
		}
	}
}

// A NATS listener off loopback needs authentication, and an MCP listener
// off loopback a token: the coordinator refuses to start without them.
// With a token (or --auth), the Kaimon bus is refused off loopback.
func TestOffLoopbackNeedsAuthentication(t *testing.T) {
	t.Parallel()
	code, _, errOut := runShoal(t, t.TempDir(), nil, "up", "--host", "0.0.0.0", "--no-node", "--no-bus")
	if code != 2 || !strings.Contains(errOut, "without authentication") {
		t.Errorf("up --host 0.0.0.0: exit %d, %q", code, errOut)
	}
	code, _, errOut = runShoal(t, t.TempDir(), nil, "up", "--leaf-listen", "0.0.0.0:7422", "--port", "-1", "--no-node", "--no-bus")
	if code != 2 || !strings.Contains(errOut, "leaf-node connections on 0.0.0.0 without authentication") {
		t.Errorf("up --leaf-listen 0.0.0.0: exit %d, %q", code, errOut)
	}
	code, _, errOut = runShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--mcp-listen", "0.0.0.0:0", "--no-node", "--no-bus")
	if code != 2 || !strings.Contains(errOut, "without a bearer token") {
		t.Errorf("up --mcp-listen 0.0.0.0:0: exit %d, %q", code, errOut)
	}
	// The bus has no credentials: it stays off the network, with or
	// without credentials of the fabric's.
	for _, args := range [][]string{{"--mcp-token", "secret"}, {}} {
		code, _, errOut = runShoal(t, t.TempDir(), nil, append([]string{"up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--bus", "tcp://0.0.0.0:0", "--no-node"}, args...)...)
		if code != 2 || !strings.Contains(errOut, "refusing to publish the Kaimon bus on tcp://0.0.0.0:0: the bus has no credentials") {
			t.Errorf("up %v --bus tcp://0.0.0.0:0: exit %d, %q", args, code, errOut)
		}
	}
	code, _, errOut = runShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem", "--no-node", "--no-bus")
	if code != 2 || !strings.Contains(errOut, "/nonexistent/cert.pem") {
		t.Errorf("up with a missing certificate: exit %d, %q", code, errOut)
	}
}

// shoal up --nats uses a NATS deployment it does not run: a nats-server
// configured with `shoal creds server-config`, with JetStream. The
// coordinator provisions the stream and buckets there and runs agents.
func TestUpOnExternalNATS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "js")
	ns := startShoalNATS(t, dir, [2]string{"coordinator", "hq"}, [2]string{"client", "cli"})
	if code, _, errOut := runShoal(t, dir, nil, "up", "--nats", ns.ClientURL(), "--creds", filepath.Join(dir, "cli.creds")); code != 2 || !strings.Contains(errOut, "needs `shoal creds coordinator") {
		t.Errorf("up --nats with a client's credentials: %d %q", code, errOut)
	}
	fake := fakemodel.Start(t, fakemodel.Config{})
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--nats", ns.ClientURL(), "--creds", filepath.Join(dir, "hq.creds"),
		"--node-name", "local", "--claude", peers.Claude.Command(t)[0], "--no-bus", "--mcp-listen", "127.0.0.1:0")
	up.waitLine("shoal: using NATS at ")
	up.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + ns.ClientURL(), "SHOAL_CREDS=" + filepath.Join(dir, "cli.creds")}
	code, out, errOut := runShoal(t, t.TempDir(), client, "open", t.TempDir())
	if code != 0 {
		t.Fatalf("open: %s", errOut)
	}
	id := strings.TrimSpace(out)
	if code, out, errOut := runShoal(t, t.TempDir(), client, "run", id, "Say ok."); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("run: %d %q %s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(store, "jetstream")); err != nil {
		t.Errorf("the deployment's store has no JetStream data: %v", err)
	}
}

// Under --auth, an agent on a remote node (its own credentials) asks
// permission: `shoal pending` lists the request while the agent waits.
// The node is then killed for good: at the request's deadline the
// coordinator denies it and it leaves every list, and a late answer is
// told it came too late.
func TestPermitsUnderAuthFromARemoteNode(t *testing.T) {
	t.Parallel()
	p := startAuthPool(t, "client", "cli")
	fake, n, as := p.fake, p.node, p.as
	must := func(args ...string) string { t.Helper(); return p.must(t, args...) }
	pending := func() []schemas.PermitRecord {
		var rep schemas.PendingReply
		if err := json.Unmarshal([]byte(must("pending", "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Requests
	}
	in, _ := json.Marshal(map[string]string{"command": "echo hi", "description": "run it"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Done."})
	const askFor = 8 * time.Second
	id := must("open", "--permission", "ask", "--ask-timeout", askFor.String(), t.TempDir())
	must("send", id, "Say hi.")
	var reqs []schemas.PermitRecord
	poll.Until(t, 60*time.Second, "shoal pending lists the remote agent's request", func() bool {
		reqs = pending()
		return len(reqs) == 1 && reqs[0].AgentID == id && reqs[0].Node == "far"
	})
	n.stop(syscall.SIGKILL)
	deadline := time.Unix(0, int64(reqs[0].Deadline*1e9))
	poll.Until(t, time.Until(deadline)+10*time.Second, "the request leaves the list", func() bool { return len(pending()) == 0 })
	if early := time.Until(deadline); early > 0 {
		t.Errorf("the request left the list %s before its deadline", early)
	}
	code, _, errOut := runShoal(t, t.TempDir(), as, "permit", id, reqs[0].RequestID, "allow")
	if code == 0 || !strings.Contains(errOut, "already answered: deny by coordinator") {
		t.Errorf("a late answer: %d %q", code, errOut)
	}
}

// shoal creds says when it makes new signing keys (a coordinator started
// with other keys refuses what they sign), and not when it uses keys that
// were there.
func TestCredsSaysItMadeNewKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A name that is none makes no keys (it made them, then refused it).
	code, _, errOut := runShoal(t, dir, nil, "creds", "node", "BAD!", "--out", filepath.Join(dir, "bad.creds"))
	if code != exitUsage || !strings.Contains(errOut, "credential name") || strings.Contains(errOut, "made new ones") {
		t.Errorf("shoal creds node BAD!: exit %d: %q", code, errOut)
	}
	code, _, errOut = runShoal(t, dir, nil, "creds", "node", "a", "--out", filepath.Join(dir, "a.creds"))
	if code != 0 || !strings.Contains(errOut, "there were no signing keys in ") || !strings.Contains(errOut, "made new ones") {
		t.Errorf("the first shoal creds: exit %d: %q", code, errOut)
	}
	code, _, errOut = runShoal(t, dir, nil, "creds", "node", "b", "--out", filepath.Join(dir, "b.creds"))
	if code != 0 || strings.Contains(errOut, "made new ones") {
		t.Errorf("the second shoal creds: exit %d: %q", code, errOut)
	}
}

// The embedded NATS server is named as the node is (as shoal config
// says), or by --server-name, with or without a cluster.
func TestServerIsNamedAsItsNode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-name", "alpha"}, "alpha"},
		{[]string{"--node-name", "alpha", "--server-name", "hub-1"}, "hub-1"},
	} {
		up := startShoal(t, t.TempDir(), nil, append([]string{"up", "--port", "-1", "--no-node", "--no-bus", "--no-mcp"}, c.args...)...)
		url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
		up.waitLine("shoal: ready")
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		if got := nc.ConnectedServerName(); got != c.want {
			t.Errorf("shoal up %v: the server is named %q, want %q", c.args, got, c.want)
		}
		nc.Close()
	}
}
