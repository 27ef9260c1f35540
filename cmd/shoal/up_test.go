package main

import (
	"flag"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal up on a fresh home starts, keeps what is published to agent.x in
// AGENTS, and still has it after a restart on the same store.
func TestUpKeepsEventsAcrossRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	up := func() (*shoalProc, string) {
		p := startShoal(t, dir, nil, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0")
		url := strings.TrimPrefix(p.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
		store := p.waitLine("shoal: JetStream store ")
		if want := filepath.Join(dir, "data", "shoal", "jetstream"); !strings.HasSuffix(store, want) {
			t.Fatalf("store line %q, want it under the XDG data dir %s", store, want)
		}
		p.waitLine("shoal: ready")
		return p, url
	}
	msgs := func(url string) (uint64, *jetstream.RawStreamMsg) {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx := t.Context()
		s, err := js.Stream(ctx, schemas.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetLastMsgForSubject(ctx, "agent.x")
		if err != nil {
			t.Fatalf("no message on agent.x: %v", err)
		}
		return info.State.Msgs, m
	}

	p, url := up()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(t.Context(), "agent.x", []byte(`{"kind":"status","turn":0,"data":{"status":"idle"}}`)); err != nil {
		t.Fatalf("publish to agent.x: %v", err)
	}
	nc.Close()
	if n, m := msgs(url); n != 1 || !strings.Contains(string(m.Data), "idle") {
		t.Fatalf("stream has %d messages, last %s", n, m.Data)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("shoal up exited %d on SIGTERM; stderr:\n%s", code, p.stderrText())
	}

	p2, url2 := up()
	if n, m := msgs(url2); n != 1 || !strings.Contains(string(m.Data), "idle") {
		t.Fatalf("after restart the stream has %d messages, last %s", n, m.Data)
	}
	if code := p2.stop(syscall.SIGINT); code != 0 {
		t.Fatalf("shoal up exited %d on SIGINT", code)
	}
}

// Bad configuration exits non-zero with one line that names the problem.
func TestUpBadConfiguration(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "plain-file")
	os.WriteFile(file, []byte("x"), 0o600)
	malformed := filepath.Join(dir, "malformed.toml")
	os.WriteFile(malformed, []byte("port = 4222\nstore = \"unterminated\n"), 0o600)
	unknownKey := filepath.Join(dir, "unknown.toml")
	os.WriteFile(unknownKey, []byte("prot = 4222\n"), 0o600)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() }) // the subtests run after this function returns
	busy := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)

	cases := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"unwritable store", nil, []string{"up", "--port", "-1", "--store", filepath.Join(file, "store")}, []string{"store dir", "not a directory"}},
		// sysfs takes no files, even from root, so this holds in CI too.
		{"store dir not writable", nil, []string{"up", "--port", "-1", "--store", "/sys"}, []string{"store dir /sys is not writable"}},
		{"port in use", nil, []string{"up", "--port", busy, "--store", filepath.Join(dir, "s1")}, []string{"127.0.0.1:" + busy, "is in use by another process", "(shoal up --port)"}},
		{"unknown flag", nil, []string{"up", "--prot", "4222"}, []string{"unknown flag --prot"}},
		{"malformed config", nil, []string{"up", "--config", malformed}, []string{malformed, "line 2"}},
		{"unknown config key", nil, []string{"up", "--config", unknownKey}, []string{unknownKey, `unknown setting "prot"`}},
		{"missing config", nil, []string{"up", "--config", filepath.Join(dir, "nope.toml")}, []string{"nope.toml", "no such file"}},
		{"bad environment", []string{"SHOAL_PORT=lots"}, []string{"up"}, []string{"SHOAL_PORT", "want an integer"}},
		// A client given a port it cannot dial says so, rather than
		// dialling the default port (another fabric, perhaps).
		{"bad port for a client", []string{"SHOAL_PORT=abc"}, []string{"ls"}, []string{"env SHOAL_PORT", `port = "abc" is not a port number`}},
		{"a NATS URL of another scheme", nil, []string{"ls", "--nats", "bogus://127.0.0.1:1"}, []string{`--nats "bogus://127.0.0.1:1": the scheme "bogus" is not nats, tls, ws or wss`}},
		// From the environment, the environment is named: --nats was
		// never given.
		{"a NATS URL of another scheme from the environment", []string{"SHOAL_NATS=bogus://127.0.0.1:1"}, []string{"ls"}, []string{`env SHOAL_NATS: nats = "bogus://127.0.0.1:1": the scheme "bogus" is not nats, tls, ws or wss`}},
		// The coordinator's closing events carry its name as their
		// producer: a node of that name would have its turns read as
		// such closings.
		{"a node named as the coordinator", nil, []string{"node", "--node-name", "coordinator", "--nats", "nats://127.0.0.1:1"}, []string{`--node-name: "coordinator" is the coordinator's name on the events it stores`}},
		{"a node's credentials named as the coordinator", nil, []string{"creds", "node", "coordinator"}, []string{`credential name: "coordinator" is the coordinator's name`}},
		{"a node given a NATS URL of another scheme", nil, []string{"node", "--nats", "nats://127.0.0.1:1,bogus://127.0.0.1:2"}, []string{`--nats "bogus://127.0.0.1:2": the scheme "bogus"`}},
		{"port out of range for a client", []string{"SHOAL_PORT=70000"}, []string{"status", "x"}, []string{"env SHOAL_PORT", `port = "70000" is not a port number`}},
		{"bad duration", nil, []string{"up", "--stream-max-age", "soon"}, []string{"soon", "not a duration"}},
		{"bad size", nil, []string{"up", "--stream-max-bytes", "huge"}, []string{"huge", "not a size"}},
		// Bounds past what the store's disk can hold: JetStream's own
		// "insufficient storage resources" said nothing of the disk or
		// of the flags that lower them.
		{"bounds past the disk", nil, []string{"up", "--port", "-1", "--no-node", "--no-bus", "--no-mcp", "--store", filepath.Join(dir, "s2"), "--repos-max-bytes", "1048576GiB"},
			[]string{"insufficient storage", "file system has", "free", "--repos-max-bytes 1048576.0 GiB", "lower --repos-max-bytes and --stream-max-bytes"}},
		{"open listener", nil, []string{"up", "--host", "0.0.0.0"}, []string{"0.0.0.0", "without authentication: turn authentication on (shoal up --auth)"}},
		// It was taken for an address off loopback, refused as listening
		// without authentication.
		{"not a host", nil, []string{"up", "--host", "not a host!"}, []string{`host "not a host!" is not an address to listen on`}},
		// Refused before the server starts (it said "NATS listening"
		// first, then exited).
		{"MCP off loopback without a token", nil, []string{"up", "--port", "-1", "--store", filepath.Join(dir, "s3"), "--mcp-listen", "0.0.0.0:0"}, []string{"refusing to serve MCP on 0.0.0.0:0 without a bearer token"}},
		{"bad log level", nil, []string{"up", "--log-level", "loud"}, []string{"loud"}},
		// Where its own server would listen means nothing beside a
		// server it does not run: it was ignored without a word.
		{"a port beside --nats", nil, []string{"up", "--nats", "nats://127.0.0.1:1", "--port", "4333"}, []string{"--nats uses a NATS deployment Shoal does not run: --port"}},
		{"a host beside --nats", nil, []string{"up", "--nats", "nats://127.0.0.1:1", "--host", "0.0.0.0"}, []string{"--nats uses a NATS deployment Shoal does not run: --host"}},
		{"stray argument", nil, []string{"up", "now"}, []string{`unexpected argument "now"`}},
		{"unknown command", nil, []string{"upp"}, []string{`unknown command "upp"`}},
		{"a flag before the command", nil, []string{"--nats", "nats://127.0.0.1:1", "ls"}, []string{"--nats before a command: flags follow the command they are for"}},
	}
	// A store or port that cannot be had is a setting to change: exit 2,
	// as a store in use.
	codes := map[string]int{"unwritable store": 2, "store dir not writable": 2, "port in use": 2}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runShoal(t, t.TempDir(), c.env, c.args...)
			if code == 0 {
				t.Fatalf("exit 0, want a failure; stderr %q", stderr)
			}
			if want, ok := codes[c.name]; ok && code != want {
				t.Errorf("exit %d, want %d; stderr %q", code, want, stderr)
			}
			if strings.Contains(stdout, "NATS listening") {
				t.Errorf("it said it listens, then refused: %q", stdout)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if len(lines) != 1 {
				t.Fatalf("stderr has %d lines, want one:\n%s", len(lines), stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("stderr %q does not mention %q", lines[0], w)
				}
			}
		})
	}
}

// Settings come from the file, then the environment, then flags.
func TestSettingsPrecedence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config", "shoal", "config.toml")
	os.MkdirAll(filepath.Dir(conf), 0o700)
	os.WriteFile(conf, []byte("port = 1111\nhost = \"127.0.0.2\"\nstream-max-age = \"3d\"\nnode-ttl = \"5s\"\n"), 0o600)
	env := map[string]string{"HOME": dir, "XDG_CONFIG_HOME": filepath.Join(dir, "config"), "SHOAL_PORT": "2222", "SHOAL_NODE_TTL": "9s"}
	getenv := func(k string) string { return env[k] }

	o := &upOptions{}
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	o.register(fs)
	if _, err := upCommand().parseSettings(fs, []string{"--node-ttl", "11s"}, new(string), getenv); err != nil {
		t.Fatal(err)
	}
	if o.host != "127.0.0.2" || o.port != 2222 || o.maxAge != 72*time.Hour || o.nodeTTL != 11*time.Second {
		t.Fatalf("got host %s port %d max-age %s node-ttl %s", o.host, o.port, o.maxAge, o.nodeTTL)
	}
}

// A Kaimon bus address another process serves stops shoal up as a port in
// use does: exit 2, one line naming it.
func TestUpRefusesABusAddressInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "kaimon.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	code, _, stderr := runShoal(t, dir, nil, "up", "--port", "-1", "--store", filepath.Join(dir, "store"), "--no-node", "--no-mcp", "--bus", "ipc://"+sock)
	if code != exitUsage || !strings.Contains(stderr, "the Kaimon bus address ipc://"+sock+" is in use by a live process") || !strings.Contains(stderr, "--no-bus") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("shoal up on a bus address in use: exit %d, %q; want 2 and one line naming it", code, stderr)
	}
}

// shoal bench measures a fabric of its own: the port or NATS URL that
// the environment or the config file give clients (a live fabric's) do
// not reach it, or its agents and turns would be that fabric's, counted
// in its usage for good. Only its own --nats names one.
func TestBenchIgnoresTheClientsFabric(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config", "shoal", "config.toml")
	os.MkdirAll(filepath.Dir(conf), 0o700)
	os.WriteFile(conf, []byte("port = 1111\n"), 0o600)
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"the config file's port", nil, nil, ""},
		{"SHOAL_PORT", map[string]string{"SHOAL_PORT": "2222"}, nil, ""},
		{"SHOAL_NATS", map[string]string{"SHOAL_NATS": "nats://127.0.0.1:3333"}, nil, ""},
		{"its own --nats", map[string]string{"SHOAL_PORT": "2222"}, []string{"--nats", "nats://127.0.0.1:4444"}, "nats://127.0.0.1:4444"},
	} {
		env := map[string]string{"HOME": dir, "XDG_CONFIG_HOME": filepath.Join(dir, "config")}
		maps.Copy(env, c.env)
		cmd := benchCommand()
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		cmd.flags(fs)
		if _, err := cmd.parseSettings(fs, c.args, new(string), func(k string) string { return env[k] }); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := fs.Lookup("nats").Value.String(); got != c.want {
			t.Errorf("%s: bench measures %q, want %q", c.name, got, c.want)
		}
	}
}

// One store, one server: a second `shoal up` on a store in use exits 2
// naming the process that holds it (by its program and command, not its
// flags, which may hold a token), before its server opens anything; the
// first keeps serving, its stream untouched.
func TestSecondUpOnALiveStore(t *testing.T) {
	t.Parallel()
	const secretToken = "sekrit-token-0123456789"
	fake := fakemodel.Start(t, fakemodel.Config{})
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	first := startShoal(t, dir, env, "up", "--port", "-1", "--store", store, "--no-bus", "--mcp-listen", "127.0.0.1:0", "--claude", peers.Claude.Command(t)[0], "--mcp-token", secretToken)
	url := strings.TrimPrefix(first.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	first.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + url}
	code, out, errOut := runShoal(t, t.TempDir(), client, "open", t.TempDir())
	if code != 0 {
		t.Fatalf("open: %s", errOut)
	}
	if code, _, errOut := runShoal(t, t.TempDir(), client, "run", strings.TrimSpace(out), "hello"); code != 0 {
		t.Fatalf("run: %s", errOut)
	}
	state := func() jetstream.StreamState {
		t.Helper()
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		s, err := js.Stream(t.Context(), schemas.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State
	}
	before := state()
	code, _, errOut = runShoal(t, dir, env, "up", "--port", "-1", "--store", store, "--no-bus", "--no-mcp", "--no-node")
	want := "store " + store + " is in use by process " + strconv.Itoa(first.cmd.Process.Pid) + " (" + filepath.Base(first.cmd.Path) + " up)"
	if code != 2 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("the second shoal up: exit %d, said %q; want 2 and one line with %q", code, errOut, want)
	}
	if strings.Contains(errOut, secretToken) {
		t.Errorf("the second shoal up printed the first one's --mcp-token: %q", errOut)
	}
	if after := state(); after.Msgs != before.Msgs || after.LastSeq != before.LastSeq {
		t.Errorf("the stream went from %d messages (last %d) to %d (last %d)", before.Msgs, before.LastSeq, after.Msgs, after.LastSeq)
	}
}
