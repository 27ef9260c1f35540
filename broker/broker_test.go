package broker_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

func TestPublishLandsInStream(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 10*time.Second)

	ack, err := js.Publish(ctx, "agent.x", []byte(`{"kind":"status","turn":0,"data":{"status":"idle"}}`))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ack.Stream != schemas.StreamName {
		t.Fatalf("stored in %q, want %s", ack.Stream, schemas.StreamName)
	}
	s, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "agent.x" || !strings.Contains(string(msg.Data), `"idle"`) {
		t.Fatalf("got %s %s", msg.Subject, msg.Data)
	}
	// Control subjects are never captured by the event stream.
	if _, err := js.Publish(ctx, "shoal.node.n1.open", []byte(`{}`)); !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("publish to a control subject went to a stream: %v", err)
	}
}

func TestRestartKeepsMessagesAndAppliesLimits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func(maxAge time.Duration) *broker.Broker {
		b := natstest.Start(t, func(c *broker.Config) {
			c.StoreDir = dir
			c.Assets.MaxAge = maxAge
		})
		return b
	}
	b := start(time.Hour)
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 20*time.Second)
	for i := range 3 {
		if _, err := js.Publish(ctx, "agent.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "x", []byte(`{"id":"x"}`)); err != nil {
		t.Fatal(err)
	}
	b.Shutdown()

	b2 := start(2 * time.Hour)
	_, js2 := natstest.JetStream(t, b2)
	s, err := js2.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("after restart the stream has %d messages, want 3", info.State.Msgs)
	}
	if info.Config.MaxAge != 2*time.Hour {
		t.Fatalf("max age after restart = %s, want the new 2h", info.Config.MaxAge)
	}
	msg, err := s.GetMsg(ctx, 3)
	if err != nil || string(msg.Data) != "2" {
		t.Fatalf("message 3 = %v %v", msg, err)
	}
	kv2, err := js2.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv2.Get(ctx, "x"); err != nil || string(e.Value()) != `{"id":"x"}` {
		t.Fatalf("agent record after restart: %v %v", e, err)
	}
}

func TestProvisionIsIdempotent(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 10*time.Second)
	if _, err := js.Publish(ctx, "agent.y", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := broker.Provision(ctx, js, broker.Assets{MaxBytes: 128 << 20}); err != nil {
			t.Fatalf("provision again: %v", err)
		}
	}
	s, _ := js.Stream(ctx, schemas.StreamName)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 1 || info.Config.MaxBytes != 128<<20 {
		t.Fatalf("msgs %d max bytes %d", info.State.Msgs, info.Config.MaxBytes)
	}
	for _, name := range []string{schemas.AgentsBucket, schemas.NodesBucket} {
		if _, err := js.KeyValue(ctx, name); err != nil {
			t.Errorf("bucket %s: %v", name, err)
		}
	}
}

func TestDuplicateMsgIDIsStoredOnce(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 10*time.Second)
	id := schemas.MsgID("x", 1)
	first, err := js.Publish(ctx, "agent.x", []byte("a"), jetstream.WithMsgID(id))
	if err != nil {
		t.Fatal(err)
	}
	second, err := js.Publish(ctx, "agent.x", []byte("a"), jetstream.WithMsgID(id))
	if err != nil {
		t.Fatal(err)
	}
	if !second.Duplicate || second.Sequence != first.Sequence {
		t.Fatalf("retry was stored again: %+v then %+v", first, second)
	}
}

func TestLargePayloads(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 20*time.Second)
	if got := nc.MaxPayload(); got != broker.DefaultMaxPayload {
		t.Fatalf("server max payload %d, want %d", got, broker.DefaultMaxPayload)
	}
	big := make([]byte, 7<<20)
	if _, err := js.Publish(ctx, "agent.big", big); err != nil {
		t.Fatalf("a 7 MiB event: %v", err)
	}
	_, err := js.Publish(ctx, "agent.big", make([]byte, 9<<20))
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("a 9 MiB event: got %v, want ErrMaxPayload", err)
	}
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	b, err := broker.New(broker.Config{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	store := b.StoreDir()
	err = b.Start(natstest.Context(t, 20*time.Second))
	want := "the client port 127.0.0.1:" + strconv.Itoa(port) + " is in use by another process"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want it to say %q", err, want)
	}
	// The store was not opened: nothing of JetStream's is in it.
	if entries, _ := os.ReadDir(store); len(entries) > 1 {
		t.Errorf("the store holds %v after a refused start", entries)
	}
}

// One store, one server: a second server on a store in use is refused
// before it opens anything, naming the process that holds it, and the
// first keeps serving.
func TestStoreInUse(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	first := natstest.Start(t, func(c *broker.Config) { c.StoreDir = store })
	second, err := broker.New(broker.Config{Port: -1, StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Shutdown()
	before, err := os.Stat(store)
	if err != nil {
		t.Fatal(err)
	}
	err = second.Start(natstest.Context(t, 20*time.Second))
	// Nothing was written into the live store, not even a file made and
	// removed (the directory's time would say so).
	if after, serr := os.Stat(store); serr != nil || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("the refused server touched the live store: modified %v, before %v (%v)", after.ModTime(), before.ModTime(), serr)
	}
	want := "store " + store + " is in use by process " + strconv.Itoa(os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) || schemas.CodeOf(err) != schemas.CodeInvalid {
		t.Fatalf("got %v, want it to say %q", err, want)
	}
	// By its program, never its flags: they may hold a token (a second
	// `shoal up` printed the first one's --mcp-token).
	if !strings.Contains(err.Error(), "("+filepath.Base(os.Args[0])+")") || strings.Contains(err.Error(), "-test.") {
		t.Errorf("the holder is not named by its program alone: %v", err)
	}
	nc := natstest.Connect(t, first)
	if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Errorf("the first server after the refused second: %v", err)
	}
}

func TestStoreDirNotWritable(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(broker.Config{Port: -1, StoreDir: filepath.Join(file, "store")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	err = b.Start(natstest.Context(t, 10*time.Second))
	if err == nil || !strings.Contains(err.Error(), "store dir") || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("got %v, want a store dir error", err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cfg  broker.Config
		want string
	}{
		{broker.Config{Host: "0.0.0.0"}, "without authentication"},
		{broker.Config{Host: "192.0.2.1"}, "without authentication"},
		{broker.Config{Cluster: broker.ClusterConfig{Name: "c", Host: "0.0.0.0"}, ServerName: "s"}, "cluster connections"},
		{broker.Config{Leaf: broker.LeafConfig{Host: "0.0.0.0", Port: 7422}}, "leaf-node connections"},
		{broker.Config{Port: 70000}, "port 70000"},
		{broker.Config{MaxPayload: 100 << 20}, "max payload"},
		{broker.Config{Cluster: broker.ClusterConfig{Name: "c"}}, "server name"},
		{broker.Config{TLS: broker.TLSConfig{Cert: "c.pem"}}, "both a certificate and its key"},
		{broker.Config{TLS: broker.TLSConfig{Cert: "c.pem", Key: "k.pem", VerifyClients: true}}, "needs a CA"},
		{broker.Config{TLS: broker.TLSConfig{Cert: "/nonexistent/c.pem", Key: "k.pem"}}, "/nonexistent/c.pem"},
		{broker.Config{Assets: broker.Assets{MaxAge: time.Second}}, "shorter than the duplicate window"},
		{broker.Config{Assets: broker.Assets{Replicas: 7}}, "replicas"},
	}
	for _, c := range cases {
		_, err := broker.New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error about %q", c.cfg, err, c.want)
		}
	}
	auth, err := broker.OpenAuthority(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broker.New(broker.Config{Host: "0.0.0.0", Auth: auth}); err != nil {
		t.Errorf("an authenticated non-loopback listener was refused: %v", err)
	}
}

// A node's heartbeat entry expires after the TTL and watchers are told.
func TestNodeEntriesExpire(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t, func(c *broker.Config) { c.Assets.NodeTTL = time.Second })
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 20*time.Second)
	kv, err := js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := kv.Put(ctx, "n1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return // the expiry marker
			}
		case <-ctx.Done():
			t.Fatal("the node entry never expired")
		}
	}
}

// Changing the duplicate window of the stream and the TTL of the nodes
// bucket on an existing store takes effect at the next Start, and at a
// Provision on a running server, and keeps what was stored.
func TestChangedDuplicatesAndNodeTTLAreApplied(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func(dup, ttl time.Duration) *broker.Broker {
		return natstest.Start(t, func(c *broker.Config) {
			c.StoreDir = dir
			c.Assets.Duplicates = dup
			c.Assets.NodeTTL = ttl
		})
	}
	ctx := natstest.Context(t, 30*time.Second)
	check := func(js jetstream.JetStream, dup, ttl time.Duration, msgs uint64) {
		t.Helper()
		s, err := js.Stream(ctx, schemas.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Duplicates != dup {
			t.Errorf("stream duplicate window = %s, want %s", info.Config.Duplicates, dup)
		}
		if info.State.Msgs != msgs {
			t.Errorf("stream holds %d messages, want %d", info.State.Msgs, msgs)
		}
		kv, err := js.KeyValue(ctx, schemas.NodesBucket)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.TTL() != ttl {
			t.Errorf("nodes bucket TTL = %s, want %s", st.TTL(), ttl)
		}
		if cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config; cfg.SubjectDeleteMarkerTTL != ttl {
			t.Errorf("nodes bucket limit marker TTL = %s, want %s", cfg.SubjectDeleteMarkerTTL, ttl)
		}
		if _, err := kv.Get(ctx, "n1"); err != nil {
			t.Errorf("node entry n1 lost: %v", err)
		}
	}

	b := start(time.Minute, 30*time.Second)
	_, js := natstest.JetStream(t, b)
	if _, err := js.Publish(ctx, "agent.x", []byte("kept"), jetstream.WithMsgID("m1")); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "n1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	check(js, time.Minute, 30*time.Second, 1)
	b.Shutdown()

	b2 := start(5*time.Minute, 45*time.Second)
	_, js2 := natstest.JetStream(t, b2)
	check(js2, 5*time.Minute, 45*time.Second, 1)

	if err := broker.Provision(ctx, js2, broker.Assets{MaxBytes: 256 << 20, Duplicates: 10 * time.Second, NodeTTL: 20 * time.Second}); err != nil {
		t.Fatalf("provision with new limits: %v", err)
	}
	check(js2, 10*time.Second, 20*time.Second, 1)
}

// A store made before the repositories' store had a bound (no MaxBytes)
// takes the bound at the next start, keeping the bundles it holds, and
// the bound changes with the setting.
func TestReposBoundIsAppliedToAnExistingStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := natstest.Context(t, 30*time.Second)
	bound := func(reposMax int64) (int64, uint64) {
		t.Helper()
		b := natstest.Start(t, func(c *broker.Config) { c.StoreDir = dir; c.Assets.ReposMaxBytes = reposMax })
		defer b.Shutdown()
		_, js := natstest.JetStream(t, b)
		obs, err := js.ObjectStore(ctx, schemas.ReposBucket)
		if err != nil {
			t.Fatal(err)
		}
		if reposMax < 0 {
			if _, err := obs.PutBytes(ctx, "r/kept.bundle", []byte("a bundle stored before the bound")); err != nil {
				t.Fatal(err)
			}
		}
		st, err := js.Stream(ctx, "OBJ_"+schemas.ReposBucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := obs.GetInfo(ctx, "r/kept.bundle"); err != nil {
			t.Errorf("the bundle stored before: %v", err)
		}
		return info.Config.MaxBytes, info.State.Msgs
	}
	if max, _ := bound(-1); max != -1 {
		t.Fatalf("no bound asked: MaxBytes %d", max)
	}
	if max, msgs := bound(0); max != broker.DefaultReposMaxBytes || msgs == 0 {
		t.Errorf("the next start with the default: MaxBytes %d, %d messages; want %d and the bundle kept", max, msgs, int64(broker.DefaultReposMaxBytes))
	}
	if max, _ := bound(1 << 30); max != 1<<30 {
		t.Errorf("a start with 1GiB: MaxBytes %d", max)
	}
}
