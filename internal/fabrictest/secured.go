package fabrictest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// Secured is a broker with authentication on, the coordinator's relay
// and fabric service, and a direct client with the coordinator's rights.
type Secured struct {
	B    *broker.Broker
	Auth *broker.Authority
	F    *client.Direct
	// Coord is the connection the relay, the fabric service and F share.
	Coord *nats.Conn
}

// StartSecured starts a Secured fabric for the test.
func StartSecured(t testing.TB, mutate ...func(*broker.Config)) *Secured {
	t.Helper()
	return StartSecuredRelay(t, func(*coordinator.RelayConfig) {}, mutate...)
}

// StartSecuredRelay starts a Secured fabric whose relay's configuration
// relay changes.
func StartSecuredRelay(t testing.TB, relay func(*coordinator.RelayConfig), mutate ...func(*broker.Config)) *Secured {
	t.Helper()
	auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	b := natstest.Start(t, append([]func(*broker.Config){func(c *broker.Config) { c.Auth = auth }}, mutate...)...)
	coord, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	Relay(t, coord, relay)
	f, err := client.NewDirect(coord, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := f.WatchNodes(ctx); err != nil {
		t.Fatal(err)
	}
	FabricService(t, coord, f)
	return &Secured{B: b, Auth: auth, F: f, Coord: coord}
}

// Creds issues credentials and returns the file's path.
func (s *Secured) Creds(t testing.TB, role broker.Role, name string) string {
	t.Helper()
	b, err := s.Auth.Issue(role, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Connect issues credentials and connects with them. A node's
// connection says hello to the relay first, as a node does: the relay
// hears a node on a door of its own, which its first words open.
func (s *Secured) Connect(t testing.TB, role broker.Role, name string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc := s.Dial(t, role, name, opts...)
	if role == broker.RoleNode {
		Hello(t, nc, name)
	}
	return nc
}

// Dial issues credentials and connects with them, saying nothing.
func (s *Secured) Dial(t testing.TB, role broker.Role, name string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append(opts, nats.UserCredentials(s.Creds(t, role, name)), nats.CustomInboxPrefix(schemas.InboxPrefix(string(role), name)))
	return natstest.Connect(t, s.B, opts...)
}

// Hello says node's hello to the relay on nc, which opens the node's
// door there.
func Hello(t testing.TB, nc *nats.Conn, node string) {
	t.Helper()
	m, err := nc.Request(schemas.RelaySubject(node, schemas.RelayHello), nil, 10*time.Second)
	if err == nil {
		err = schemas.DecodeReply(m.Data, &schemas.RelayHelloReply{})
	}
	if err != nil {
		t.Fatalf("node %s's hello to the relay: %v", node, err)
	}
}

// StartNode runs a confined node with the echo backend.
func (s *Secured) StartNode(t testing.TB, name string) {
	t.Helper()
	s.RunNode(t, name, s.Connect(t, broker.RoleNode, name))
}

// RunNode runs a confined node on nc, with the echo backend unless bs
// are given.
func (s *Secured) RunNode(t testing.TB, name string, nc *nats.Conn, bs ...backend.Backend) {
	t.Helper()
	if len(bs) == 0 {
		bs = []backend.Backend{fakebackend.New(fakebackend.Config{})}
	}
	h, err := node.New(node.Config{Name: name, Conn: nc, Dir: t.TempDir(), Backends: bs, Confined: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-h.Ready():
	case err := <-done:
		done <- err // for the cleanup, which waits for it
		t.Fatalf("node %s did not start: %v", name, err)
	}
	// Placement knows the node once the coordinator's view has its entry.
	wait := natstest.Context(t, 10*time.Second)
	for {
		nodes, _ := s.F.Nodes(wait)
		if slices.ContainsFunc(nodes, func(n schemas.NodeRecord) bool { return n.Name == name }) {
			return
		}
		select {
		case <-wait.Done():
			t.Fatalf("node %s never appeared in the coordinator's view", name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
