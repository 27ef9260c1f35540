package broker_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/tlstest"
	"github.com/shoalfabric/shoal/schemas"
)

// Three brokers routed into one cluster provision the stream and buckets
// with three replicas, and an event published to one member is stored.
func TestClusterReplicatesAssets(t *testing.T) {
	t.Parallel()
	brokers := startCluster(t, nil)
	_, js := natstest.JetStream(t, brokers[1])
	ctx := natstest.Context(t, 30*time.Second)
	if _, err := js.Publish(ctx, "agent.c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	kv, err := js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
		t.Fatalf("bucket %s is not replicated 3 times", schemas.NodesBucket)
	}
}

// Members with authentication and TLS authenticate their routes with the
// authority's secret over TLS, and clients need credentials.
func TestClusterWithAuthAndTLS(t *testing.T) {
	t.Parallel()
	auth, err := broker.OpenAuthority(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca := tlstest.NewCA(t, "cluster")
	brokers := startCluster(t, func(i int, c *broker.Config) {
		pair := ca.Issue(t, fmt.Sprintf("s%d", i))
		c.Auth = auth
		c.TLS = broker.TLSConfig{Cert: pair.Cert, Key: pair.Key, CA: ca.File}
	})
	creds := issue(t, auth, broker.RoleCoordinator, "admin")
	nc := natstest.Connect(t, brokers[2], nats.UserCredentials(creds), nats.RootCAs(ca.File))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, 30*time.Second)
	if _, err := js.Publish(ctx, "agent.c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.CachedInfo().Cluster; c == nil || len(c.Replicas) != 2 {
		t.Fatalf("stream cluster %+v", c)
	}
}

// startCluster runs three brokers routed into one cluster with R3 assets.
// Members started one after another wait for the rest: two members
// elect a meta leader, and until the third reports in JetStream answers
// a three-replica stream with "no suitable peers for placement".
func TestClusterMembersStartedApart(t *testing.T) {
	t.Parallel()
	startCluster(t, nil, 3*time.Second)
}

// startCluster starts three members, the last one late after the
// others when late is given.
func startCluster(t *testing.T, mutate func(int, *broker.Config), late ...time.Duration) []*broker.Broker {
	t.Helper()
	ports := freePorts(t, 3)
	routes := make([]string, len(ports))
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	brokers := make([]*broker.Broker, 3)
	done := make(chan error, 3)
	for i := range brokers {
		cfg := broker.Config{
			Port: -1, StoreDir: t.TempDir(), ServerName: fmt.Sprintf("s%d", i),
			Cluster: broker.ClusterConfig{Name: "shoal-test", Port: ports[i], Routes: routes},
			Assets:  broker.Assets{MaxBytes: 64 << 20, Replicas: 3},
		}
		if mutate != nil {
			mutate(i, &cfg)
		}
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Shutdown)
		brokers[i] = b
		go func() {
			if i == len(brokers)-1 && len(late) > 0 {
				time.Sleep(late[0])
			}
			done <- b.Start(natstest.Context(t, 60*time.Second))
		}()
	}
	for range brokers {
		if err := <-done; err != nil {
			t.Fatalf("start a cluster member: %v", err)
		}
	}
	return brokers
}

// A NATS server that dials the broker's leaf-node port carries events from
// its clients into the AGENTS stream.
func TestLeafNodeEventsReachTheStream(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t, func(c *broker.Config) { c.Leaf.Port = -1 })
	leafURL := b.LeafURL()
	if !strings.HasPrefix(leafURL, "nats-leaf://127.0.0.1:") {
		t.Fatalf("leaf URL %q", leafURL)
	}
	u, err := url.Parse(leafURL)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		LeafNode: server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	go leaf.Start()
	t.Cleanup(leaf.Shutdown)
	if !leaf.ReadyForConnections(10 * time.Second) {
		t.Fatal("leaf server not ready")
	}
	ctx := natstest.Context(t, 20*time.Second)
	for leaf.NumLeafNodes() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the leaf never connected")
		case <-time.After(20 * time.Millisecond):
		}
	}
	nc, err := nats.Connect(leaf.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "agent.remote", []byte("from behind NAT")); err != nil {
		t.Fatalf("publish through the leaf: %v", err)
	}
	_, hubJS := natstest.JetStream(t, b)
	s, _ := hubJS.Stream(ctx, schemas.StreamName)
	m, err := s.GetLastMsgForSubject(ctx, "agent.remote")
	if err != nil || string(m.Data) != "from behind NAT" {
		t.Fatalf("hub stream: %v %v", m, err)
	}
}
