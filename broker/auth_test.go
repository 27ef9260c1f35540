package broker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// authBroker starts a broker with authentication on and returns it with
// its authority.
func authBroker(t *testing.T) (*broker.Broker, *broker.Authority) {
	t.Helper()
	auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	b := natstest.Start(t, func(c *broker.Config) { c.Auth = auth })
	return b, auth
}

// issue writes credentials for role and name and returns their path.
func issue(t *testing.T, auth *broker.Authority, role broker.Role, name string) string {
	t.Helper()
	b, err := auth.Issue(role, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// scoped is a connection made with issued credentials, which reports the
// permission violations the server sends it.
type scoped struct {
	nc         *nats.Conn
	violations chan string
}

func connectAs(t *testing.T, b *broker.Broker, creds string) *scoped {
	t.Helper()
	c, err := broker.ReadCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	s := &scoped{violations: make(chan string, 16)}
	s.nc = natstest.Connect(t, b, nats.UserCredentials(creds), nats.CustomInboxPrefix(c.InboxPrefix()),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			s.violations <- err.Error()
		}))
	return s
}

// denied asserts that the server refuses what do attempts, naming subject.
func (s *scoped) denied(t *testing.T, what, subject string, do func() error) {
	t.Helper()
	if err := do(); err != nil && !strings.Contains(err.Error(), "ermission") {
		t.Fatalf("%s: %v", what, err)
	}
	s.nc.Flush()
	select {
	case v := <-s.violations:
		if !strings.Contains(v, "Permissions Violation") || !strings.Contains(v, subject) {
			t.Fatalf("%s: got %q, want a permissions violation for %s", what, v, subject)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not refused", what)
	}
}

// allowed asserts that a publish on subject reaches a subscriber with
// full rights.
func allowed(t *testing.T, b *broker.Broker, s *scoped, subject string) {
	t.Helper()
	admin, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	sub, err := admin.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	admin.Flush()
	if err := s.nc.Publish(subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("a publish on %s did not arrive: %v", subject, err)
	}
}

func TestAnonymousClientsAreRefused(t *testing.T) {
	t.Parallel()
	b, auth := authBroker(t)
	if _, err := nats.Connect(b.ClientURL()); err == nil || !strings.Contains(err.Error(), "Authorization") {
		t.Fatalf("anonymous client: got %v, want an authorization error", err)
	}
	other, err := broker.OpenAuthority(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stranger := issue(t, other, broker.RoleClient, "stranger")
	if _, err := nats.Connect(b.ClientURL(), nats.UserCredentials(stranger)); err == nil {
		t.Fatal("credentials from another authority were accepted")
	}
	c := connectAs(t, b, issue(t, auth, broker.RoleClient, "cli"))
	if !c.nc.IsConnected() {
		t.Fatal("a client with issued credentials is not connected")
	}
	internal, err := b.Connect()
	if err != nil {
		t.Fatalf("in-process connection: %v", err)
	}
	internal.Close()
}

// A node answers only its own control subjects, talks to the fabric only
// through its own relay subjects, and has no JetStream API: JetStream
// would answer on any reply subject, including another agent's KV key.
func TestNodeCredentialsAreConfined(t *testing.T) {
	t.Parallel()
	b, auth := authBroker(t)
	a := connectAs(t, b, issue(t, auth, broker.RoleNode, "a"))

	allowed(t, b, a, schemas.RelaySubject("a", schemas.RelayEvent, "x1"))
	a.denied(t, "publishing node b's events", "shoal.relay.b.event.x2", func() error {
		return a.nc.Publish(schemas.RelaySubject("b", schemas.RelayEvent, "x2"), []byte("{}"))
	})
	// The relay's grant answers with the asking node's MCP key: another
	// node's key would let a node's agents act as that node's.
	allowed(t, b, a, schemas.RelaySubject("a", schemas.RelayGrant))
	a.denied(t, "asking node b's MCP grant", "shoal.relay.b.grant", func() error {
		return a.nc.PublishRequest(schemas.RelaySubject("b", schemas.RelayGrant), a.nc.NewInbox(), nil)
	})
	a.denied(t, "publishing on agent.x2", "agent.x2", func() error {
		return a.nc.Publish(schemas.EventSubject("x2"), []byte("{}"))
	})
	a.denied(t, "ending a fast batch (a confined node publishes through its relay)", schemas.BatchEndSubject, func() error {
		return a.nc.Publish(schemas.BatchEndSubject, []byte("{}"))
	})
	// The relay hands JetStream's acknowledgements of what it forwards on
	// to nodes: a node's forged one would have another node's event taken
	// for stored.
	forged := schemas.RelayAckPrefix + ".relay.1"
	a.denied(t, "forging the relay's acknowledgement of an event", forged, func() error {
		return a.nc.Publish(forged, []byte(`{"stream":"AGENTS","seq":1}`))
	})
	a.denied(t, "setting a budget", schemas.FabricSubject(schemas.VerbBudget), func() error {
		return a.nc.Publish(schemas.FabricSubject(schemas.VerbBudget), []byte("{}"))
	})
	a.denied(t, "answering node b's control subjects", "shoal.node.b.send", func() error {
		_, err := a.nc.Subscribe(schemas.ControlSubject("b", schemas.VerbSend), func(*nats.Msg) {})
		return err
	})
	a.denied(t, "reading node b's replies", "_INBOX.node-b.>", func() error {
		_, err := a.nc.Subscribe("_INBOX.node-b.>", func(*nats.Msg) {})
		return err
	})
	a.denied(t, "a JetStream request", "$JS.API.DIRECT.GET", func() error {
		return a.nc.PublishRequest("$JS.API.DIRECT.GET.KV_shoal_agents.$KV.shoal_agents.a1", "$KV.shoal_agents.victim", nil)
	})
	a.denied(t, "writing the agents bucket", "$KV.shoal_agents.victim", func() error {
		return a.nc.Publish("$KV.shoal_agents.victim", []byte("{}"))
	})
	a.denied(t, "sending another node a request", "shoal.node.b.close", func() error {
		return a.nc.Publish(schemas.ControlSubject("b", schemas.VerbClose), []byte("{}"))
	})
	sub, err := a.nc.SubscribeSync(schemas.ControlSubject("a", schemas.VerbSend))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	a.nc.Flush()
	admin.Publish(schemas.ControlSubject("a", schemas.VerbSend), []byte("{}"))
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("node a does not receive its own control requests: %v", err)
	}
}

func TestObserverCanOnlyRead(t *testing.T) {
	t.Parallel()
	b, auth := authBroker(t)
	o := connectAs(t, b, issue(t, auth, broker.RoleObserver, "eyes"))
	for _, v := range schemas.FabricReadVerbs() {
		allowed(t, b, o, schemas.FabricSubject(v))
	}
	for _, v := range []string{"open", "send", "run", "interrupt", "close", "set_model", "permit", "budget"} {
		o.denied(t, "an observer's "+v, "shoal.fabric."+v, func() error {
			return o.nc.Publish("shoal.fabric."+v, []byte("{}"))
		})
	}
	o.denied(t, "an observer's request to a node", "shoal.node.a.send", func() error {
		return o.nc.Publish(schemas.ControlSubject("a", schemas.VerbSend), []byte("{}"))
	})
	if _, err := o.nc.SubscribeSync(schemas.EventSubject("x1")); err != nil {
		t.Fatal(err)
	}
	c := connectAs(t, b, issue(t, auth, broker.RoleClient, "cli"))
	allowed(t, b, c, "shoal.fabric.send")
	c.denied(t, "a client's request straight to a node", "shoal.node.a.send", func() error {
		return c.nc.Publish(schemas.ControlSubject("a", schemas.VerbSend), []byte("{}"))
	})
	c.denied(t, "a client's JetStream request", "$JS.API.INFO", func() error {
		return c.nc.Publish("$JS.API.INFO", nil)
	})
	// Where nodes end their fast batches is in the stream: what a scoped
	// role published there, outside a batch, would be stored.
	for _, who := range []*scoped{c, o} {
		who.denied(t, "a scoped publish to "+schemas.BatchEndSubject, schemas.BatchEndSubject, func() error {
			return who.nc.Publish(schemas.BatchEndSubject, []byte("{}"))
		})
	}
}

func TestCredentials(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	auth, err := broker.OpenAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"operator.nk", "system.nk", "account.nk", "route.secret"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	path := issue(t, auth, broker.RoleNode, "mac-1")
	c, err := broker.ReadCredentials(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Role != broker.RoleNode || c.Name != "mac-1" || !c.Expires.IsZero() || c.InboxPrefix() != "_INBOX.node-mac-1" {
		t.Fatalf("read back %+v", c)
	}

	// The same directory, opened again, is the same authority: what the
	// first issued, a server started from the second accepts.
	again, err := broker.OpenAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := natstest.Start(t, func(c *broker.Config) { c.Auth = again })
	connectAs(t, b, path)

	if _, err := auth.Issue(broker.RoleNode, "Bad Name", 0); err == nil || !strings.Contains(err.Error(), "credential name") {
		t.Errorf("a bad name: %v", err)
	}
	if _, err := auth.Issue("admin", "x", 0); err == nil || !strings.Contains(err.Error(), "unknown role") {
		t.Errorf("a bad role: %v", err)
	}
	short, err := auth.Issue(broker.RoleClient, "brief", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	briefPath := filepath.Join(t.TempDir(), "brief.creds")
	os.WriteFile(briefPath, short, 0o600)
	if c, err := broker.ReadCredentials(briefPath); err != nil || c.Expires.IsZero() {
		t.Fatalf("expiring credentials read back as %+v, %v", c, err)
	}
	garbage := filepath.Join(t.TempDir(), "garbage.creds")
	os.WriteFile(garbage, []byte("hello"), 0o600)
	if _, err := broker.ReadCredentials(garbage); err == nil || !strings.Contains(err.Error(), garbage) {
		t.Errorf("a garbage file: %v", err)
	}
	if _, err := broker.ReadCredentials(filepath.Join(t.TempDir(), "none.creds")); err == nil || !strings.Contains(err.Error(), "none.creds") {
		t.Errorf("a missing file: %v", err)
	}
	if cfg := auth.ServerConfig(); !strings.Contains(cfg, "operator:") || !strings.Contains(cfg, "resolver_preload") {
		t.Errorf("server config:\n%s", cfg)
	}
}

// Clients and observers receive every agent's events, each with the reply
// subject its publisher's acknowledgement comes to (the relay's, a node's
// fast batch's): with the right to answer what they receive, an observer
// answered them, an error that failed a node's publish, or a success for
// an event the stream may never have stored. They may answer a replay's
// flow control alone.
func TestScopedRolesAnswerNoPublishersAcknowledgement(t *testing.T) {
	t.Parallel()
	b, auth := authBroker(t)
	admin, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	acks, err := admin.SubscribeSync("_INBOX.publisher.>")
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []broker.Role{broker.RoleObserver, broker.RoleClient} {
		who := connectAs(t, b, issue(t, auth, role, "forger-"+string(role)))
		events, err := who.nc.SubscribeSync(schemas.EventSubjects)
		if err != nil {
			t.Fatal(err)
		}
		who.nc.Flush()
		reply := "_INBOX.publisher." + string(role)
		if err := admin.PublishMsg(&nats.Msg{Subject: schemas.EventSubject("a1"), Reply: reply, Data: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		m, err := events.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Reply != reply {
			t.Fatalf("the event's reply subject as the %s received it: %q", role, m.Reply)
		}
		who.denied(t, "the "+string(role)+"'s answer to an event's publisher", reply, func() error {
			return m.Respond([]byte(`{"error":{"code":503,"description":"forged"}}`))
		})
		allowed(t, b, who, schemas.ReplayAckPrefix+".abc.1")
	}
	// The stream's own acknowledgements come; no forged one.
	for {
		m, err := acks.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		if strings.Contains(string(m.Data), "forged") {
			t.Errorf("a publisher heard an answer forged by a scoped role: %s %s", m.Subject, m.Data)
		}
	}
}
