package coordinator_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// The server takes at most half the process's open-file limit in
// clients, and each confined node costs the relay one more connection,
// its door. A node that got the server's last place was answered its
// hello and its heartbeats, which the lobby takes, and so looked alive to
// placement, while its door was refused: every other operation of its
// found no responder. A door that cannot be dialled is heard on the
// relay's own connection instead (no flood of the node's is kept from
// the others then, as before doors), and the node is served.
func TestRelayHearsANodeWhoseDoorIsRefused(t *testing.T) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = 200 // the server then takes 100 clients
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	s := fabrictest.StartSecured(t)
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)

	// Fill the server, then free one place: the node's own connection.
	var fillers []*nats.Conn
	t.Cleanup(func() {
		for _, nc := range fillers {
			nc.Close()
		}
	})
	for {
		nc, err := s.B.Connect()
		if err != nil {
			t.Logf("the server is full after %d more connections: %v", len(fillers), err)
			break
		}
		fillers = append(fillers, nc)
		if len(fillers) > 500 {
			t.Fatal("the server never filled")
		}
	}
	fillers[len(fillers)-1].Close()
	fillers = fillers[:len(fillers)-1]
	time.Sleep(200 * time.Millisecond)

	b, err := s.Auth.Issue(broker.RoleNode, "n1", 0)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "n1.creds")
	os.WriteFile(creds, b, 0o600)
	node, err := s.B.Connect(nats.UserCredentials(creds), nats.CustomInboxPrefix(schemas.InboxPrefix(string(broker.RoleNode), "n1")))
	if err != nil {
		t.Fatalf("the node could not connect (no place left for it): %v", err)
	}
	defer node.Close()
	m, err := node.Request(schemas.RelaySubject("n1", schemas.RelayHello), nil, 15*time.Second)
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	var rep schemas.RelayHelloReply
	if err := schemas.DecodeReply(m.Data, &rep); err != nil {
		t.Fatalf("hello refused: %v", err)
	}
	rec := []byte(`{"name":"n1","instance":"i1","version":"0.0.0-test"}`)
	if _, err := node.Request(schemas.RelaySubject("n1", schemas.RelayBeat), rec, 15*time.Second); err != nil {
		t.Errorf("beat: %v", err)
	}
	for i := range 3 {
		_, err := node.Request(schemas.RelaySubject("n1", schemas.RelayGet, "a1"), nil, 2*time.Second)
		if errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("get %d: node n1 is connected and its hello was answered, but the relay does not hear it: %v", i, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
