package deploy_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/shoalfabric/shoal/internal/tlstest"
)

// natsSite is what a NATS example refers to, made for a test: a
// directory standing for /etc/nats with a CA (ca.pem) and a server
// certificate for 127.0.0.1 (server.pem, server-key.pem), and Shoal's keys
// with their server configuration in shoal-accounts.conf, written by
// `shoal creds server-config` as the examples say.
type natsSite struct {
	etc     string // stands for /etc/nats
	authDir string // the coordinator's keys
}

func newNATSSite(t *testing.T) *natsSite {
	t.Helper()
	ca := tlstest.NewCA(t, "ca")
	ca.Issue(t, "server")
	s := &natsSite{etc: ca.Dir, authDir: filepath.Join(t.TempDir(), "auth")}
	b, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	s.write(t, "ca.pem", b)
	s.write(t, "shoal-accounts.conf", s.shoal(t, "creds", "server-config"))
	return s
}

func (s *natsSite) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(s.etc, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// shoal runs a shoal command where the coordinator's keys are and
// returns its standard output.
func (s *natsSite) shoal(t *testing.T, args ...string) []byte {
	t.Helper()
	return runShoal(t, []string{"SHOAL_AUTH_DIR=" + s.authDir}, args...)
}

// creds issues credentials for role name into the site's directory.
func (s *natsSite) creds(t *testing.T, role, name string) string {
	t.Helper()
	return s.write(t, name+".creds", s.shoal(t, "creds", role, name))
}

// runShoal runs a shoal command to its end with env and returns its
// standard output, failing the test if it fails.
func runShoal(t *testing.T, env []string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(shoalBin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + cmd.Dir}, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("shoal %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// startShoal starts a long-running shoal command and waits until it says
// it is up.
func startShoal(t *testing.T, ready string, args ...string) {
	t.Helper()
	cmd := exec.Command(shoalBin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + cmd.Dir}
	startRunning(t, "shoal "+args[0], cmd).waitLine(t, "shoal "+args[0], ready)
}

// example reads deploy/nats/name with /etc/nats/ standing for the site's
// directory and each old string replaced by its new one (addresses on
// this machine), writes it to the site's directory as as, and returns its
// path.
func (s *natsSite) example(t *testing.T, name, as string, replace ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("nats", name))
	if err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer(append([]string{"/etc/nats/", s.etc + "/"}, replace...)...)
	return s.write(t, as, []byte(r.Replace(string(b))))
}

// startServer runs nats-server on the configuration file path, as
// `nats-server -c path` does, and waits until it takes connections.
func startServer(t *testing.T, path string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server -c %s: %v", filepath.Base(path), err)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server -c %s: %v", filepath.Base(path), err)
	}
	go srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats-server -c %s did not start", filepath.Base(path))
	}
	return srv
}

// waitNodes waits until `shoal nodes` with args lists every node named.
func waitNodes(t *testing.T, env []string, args []string, names ...string) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out = string(runShoal(t, env, append([]string{"nodes"}, args...)...))
		all := true
		for _, n := range names {
			all = all && strings.Contains(out, "\n"+n+" ")
		}
		if all {
			return
		}
	}
	t.Fatalf("shoal nodes does not list %v:\n%s", names, out)
}

// The cluster example, as three servers on this machine: each loads it
// with nothing changed but its name and addresses; they form one cluster
// over certificate-checked routes; `shoal up --nats` runs the coordinator
// on it with JetStream in three replicas, as the example's comments say;
// a node joins with its credentials through the client port and another
// dials in as a leaf node; and a client lists both.
func TestNATSClusterExample(t *testing.T) {
	t.Parallel()
	site := newNATSSite(t)
	names := []string{"a", "b", "c"}
	client, route, leaf := map[string]string{}, map[string]string{}, map[string]string{}
	for _, n := range names {
		client[n], route[n], leaf[n] = freePort(t), freePort(t), freePort(t)
	}
	var servers []string
	for _, n := range names {
		replace := []string{
			"server_name: a", "server_name: " + n,
			"0.0.0.0:4222", "127.0.0.1:" + client[n],
			"0.0.0.0:6222", "127.0.0.1:" + route[n],
			"0.0.0.0:7422", "127.0.0.1:" + leaf[n],
			"/var/lib/nats/jetstream", filepath.Join(t.TempDir(), "jetstream"),
		}
		for _, m := range names {
			replace = append(replace, "nats-route://"+m+":6222", "nats-route://127.0.0.1:"+route[m])
		}
		path := site.example(t, "cluster.conf", n+".conf", replace...)
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("cluster.conf as %s: %v", n, err)
		}
		if !opts.JetStream || opts.Cluster.Name != "shoal" || len(opts.Routes) != 3 || opts.Cluster.TLSConfig == nil ||
			opts.TLSConfig == nil || opts.LeafNode.TLSConfig == nil || len(opts.TrustedOperators) != 1 || opts.SystemAccount == "" {
			t.Fatalf("cluster.conf as %s: jetstream %v, cluster %q with routes %v, TLS for clients %v, routes %v, leaf nodes %v, operators %d, system account %q",
				n, opts.JetStream, opts.Cluster.Name, opts.Routes, opts.TLSConfig != nil, opts.Cluster.TLSConfig != nil, opts.LeafNode.TLSConfig != nil, len(opts.TrustedOperators), opts.SystemAccount)
		}
		servers = append(servers, path)
	}
	for _, path := range servers {
		startServer(t, path)
	}
	var urls []string
	for _, n := range names {
		urls = append(urls, "tls://127.0.0.1:"+client[n])
	}
	fabric := strings.Join(urls, ",")
	ca := filepath.Join(site.etc, "ca.pem")

	startShoal(t, "shoal: ready", "up", "--nats", fabric, "--tls-ca", ca, "--creds", site.creds(t, "coordinator", "hq"), "--replicas", "3", "--no-node", "--no-bus", "--no-mcp")
	startShoal(t, "shoal: node ", "node", "--nats", fabric, "--tls-ca", ca, "--creds", site.creds(t, "node", "gpu1"))
	startShoal(t, "shoal: node ", "node", "--leaf", "nats-leaf://127.0.0.1:"+leaf["b"], "--tls-ca", ca, "--creds", site.creds(t, "node", "mac"))
	waitNodes(t, nil, []string{"--nats", fabric, "--tls-ca", ca, "--creds", site.creds(t, "client", "me")}, "gpu1", "mac")
}

// The leaf example: a nats-server on a machine that only dials out joins
// a coordinator (shoal up --auth --leaf-listen) with a node's
// credentials, and that node, connected to it on loopback, joins the
// fabric; a client at the coordinator lists it.
func TestNATSLeafExample(t *testing.T) {
	t.Parallel()
	site := newNATSSite(t)
	port, leafPort, local := freePort(t), freePort(t), freePort(t)
	ca := filepath.Join(site.etc, "ca.pem")
	startShoal(t, "shoal: ready", "up", "--auth", "--auth-dir", site.authDir, "--port", port, "--leaf-listen", "127.0.0.1:"+leafPort,
		"--tls-cert", filepath.Join(site.etc, "server.pem"), "--tls-key", filepath.Join(site.etc, "server-key.pem"),
		"--store", filepath.Join(t.TempDir(), "jetstream"), "--no-node", "--no-bus", "--no-mcp")

	creds := site.creds(t, "node", "mac")
	path := site.example(t, "leaf.conf", "leaf.conf",
		"nats-leaf://hub:7422", "nats-leaf://127.0.0.1:"+leafPort,
		"127.0.0.1:4222", "127.0.0.1:"+local)
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("leaf.conf: %v", err)
	}
	if len(opts.LeafNode.Remotes) != 1 || opts.LeafNode.Remotes[0].Credentials != creds || opts.Host != "127.0.0.1" {
		t.Fatalf("leaf.conf: listens on %s, remotes %+v", opts.Host, opts.LeafNode.Remotes)
	}
	leaf := startServer(t, path)
	for deadline := time.Now().Add(20 * time.Second); leaf.NumLeafNodes() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the leaf server did not join the coordinator")
		}
	}
	startShoal(t, "shoal: node ", "node", "--nats", "nats://127.0.0.1:"+local, "--creds", creds)
	waitNodes(t, nil, []string{"--nats", "tls://127.0.0.1:" + port, "--tls-ca", ca, "--creds", site.creds(t, "client", "me")}, "mac")
}

// The shared-account example, filled in as its comments say from
// `shoal creds server-config` and a deployment's own operator, system
// account and an application's account: the server loads it; Shoal's
// coordinator, a node and a client work in the SHOAL account as on
// Shoal's own server; and the application's account, with JetStream of
// its own, does not see Shoal's stream.
func TestNATSSharedAccountExample(t *testing.T) {
	t.Parallel()
	site := newNATSSite(t)
	raw, err := os.ReadFile("nats/shared-account.conf")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conf.Parse(string(raw)); err != nil {
		t.Fatalf("shared-account.conf as shipped: %v", err)
	}

	// Shoal's operator and account, from shoal creds server-config.
	shoalConfig := string(site.shoal(t, "creds", "server-config"))
	var shoalOperator string
	for _, line := range strings.Split(shoalConfig, "\n") {
		if jwtText, ok := strings.CutPrefix(line, "operator: "); ok {
			shoalOperator = jwtText
		}
	}
	site.write(t, "shoal-operator.jwt", []byte(shoalOperator+"\n"))
	parsed, err := conf.Parse(shoalConfig)
	if err != nil {
		t.Fatalf("shoal creds server-config: %v", err)
	}
	preload, _ := parsed["resolver_preload"].(map[string]any)
	var shoalKey, shoalJWT string
	for k, v := range preload {
		token, _ := v.(string)
		if ac, err := jwt.DecodeAccountClaims(token); err == nil && ac.Name == "SHOAL" {
			shoalKey, shoalJWT = k, token
		}
	}
	if shoalOperator == "" || shoalKey == "" {
		t.Fatalf("shoal creds server-config has no operator line or no SHOAL account:\n%s", shoalConfig)
	}

	// The deployment's own operator, system account and an application's
	// account with a user.
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	sys, _ := nkeys.CreateAccount()
	sysPub, _ := sys.PublicKey()
	app, _ := nkeys.CreateAccount()
	appPub, _ := app.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	site.write(t, "operator.jwt", []byte(opJWT))
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	appClaims := jwt.NewAccountClaims(appPub)
	appClaims.Name = "APP"
	appClaims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	appJWT, err := appClaims.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	userSeed, _ := user.Seed()
	userJWT, err := jwt.NewUserClaims(userPub).Encode(app)
	if err != nil {
		t.Fatal(err)
	}

	port := freePort(t)
	path := site.example(t, "shared-account.conf", "shared.conf",
		"0.0.0.0:4222", "127.0.0.1:"+port,
		"/var/lib/nats/jetstream", filepath.Join(t.TempDir(), "jetstream"),
		"SHOAL_ACCOUNT_KEY: SHOAL_ACCOUNT_JWT", shoalKey+": "+shoalJWT,
		"SYS_ACCOUNT_KEY: SYS_ACCOUNT_JWT", sysPub+": "+sysJWT,
		"APP_ACCOUNT_KEY: APP_ACCOUNT_JWT", appPub+": "+appJWT,
		"SYS_ACCOUNT_KEY", sysPub)
	startServer(t, path)

	fabric, ca := "tls://127.0.0.1:"+port, filepath.Join(site.etc, "ca.pem")
	startShoal(t, "shoal: ready", "up", "--nats", fabric, "--tls-ca", ca, "--creds", site.creds(t, "coordinator", "hq"), "--no-node", "--no-bus", "--no-mcp")
	startShoal(t, "shoal: node ", "node", "--nats", fabric, "--tls-ca", ca, "--creds", site.creds(t, "node", "gpu1"))
	waitNodes(t, nil, []string{"--nats", fabric, "--tls-ca", ca, "--creds", site.creds(t, "client", "me")}, "gpu1")

	// Each account's JetStream holds its own streams: Shoal's AGENTS in
	// SHOAL, none in the application's.
	streams := func(opts ...nats.Option) []string {
		t.Helper()
		nc, err := nats.Connect(fabric, append(opts, nats.RootCAs(ca))...)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var names []string
		list := js.StreamNames(ctx)
		for n := range list.Name() {
			names = append(names, n)
		}
		if err := list.Err(); err != nil {
			t.Fatalf("stream names: %v", err)
		}
		return names
	}
	if got := streams(nats.UserCredentials(filepath.Join(site.etc, "hq.creds"))); !slices.Contains(got, "AGENTS") {
		t.Errorf("SHOAL's streams: %v, want AGENTS", got)
	}
	if got := streams(nats.UserJWTAndSeed(userJWT, string(userSeed))); len(got) != 0 {
		t.Errorf("the application's account sees the streams %v", got)
	}
}

// The shoal commands the NATS examples show are ones the binary accepts.
func TestNATSExampleCommands(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("nats/*.conf")
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		files[i] = filepath.Base(files[i])
	}
	if !slices.Equal(files, []string{"cluster.conf", "leaf.conf", "shared-account.conf"}) {
		t.Fatalf("deploy/nats has %v; each example needs a test here", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join("nats", f))
		if err != nil {
			t.Fatal(err)
		}
		cmds := documentedCommands(t, comments(string(b)))
		if len(cmds) == 0 {
			t.Errorf("%s shows no shoal command", f)
		}
		for _, c := range cmds {
			if err := accepts(c); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
}
