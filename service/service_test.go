package service_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/schemas/validate"
	"github.com/shoalfabric/shoal/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type counts struct{ n atomic.Int32 }

func (c *counts) RequestFailed(schemas.Verb, schemas.ErrorCode) { c.n.Add(1) }

// The adapter: a request that does not fit its schema, and one that
// fails before any long wait, are answered while micro still counts
// them, with the service-error headers; a request that starts a long wait
// lets the endpoint take the next one; each runs within its deadline; and
// Wait waits for the one still running.
func TestHandlerHoldsOnlyWhatAnswersAtOnce(t *testing.T) {
	b := natstest.Start(t)
	nc := natstest.Connect(t, b)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	failed := &counts{}
	srv := service.NewServer(ctx, failed, 0)
	release, waiting := make(chan struct{}), make(chan struct{})
	var deadline time.Duration
	h := service.Handler(srv, service.Endpoint[schemas.SendRequest]{
		Verb: schemas.VerbSend, Schema: validate.MustFull("send_request"),
		Deadline: func(schemas.SendRequest) time.Duration { return time.Hour },
		Handle: func(ctx context.Context, req schemas.SendRequest, _ []byte) service.Reply {
			if req.Text == "fail" {
				return service.Encode(nil, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", req.AgentID))
			}
			d, _ := ctx.Deadline()
			deadline = time.Until(d)
			service.LongWait(ctx)
			close(waiting)
			<-release
			return service.Encode(schemas.SendReply{Turn: 7}, nil)
		},
	})
	svc, err := micro.AddService(nc, micro.Config{Name: "t", Version: "0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.AddEndpoint("send", h, micro.WithEndpointSubject("t.send")); err != nil {
		t.Fatal(err)
	}
	// The endpoint's subscription reaches the server before another
	// connection asks it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	caller := natstest.Connect(t, b)
	ask := func(body string) *nats.Msg {
		t.Helper()
		m, err := caller.Request("t.send", []byte(body), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := ask(`{"agent_id":"a"}`); m.Header.Get(micro.ErrorCodeHeader) != "400" || m.Header.Get(micro.ErrorHeader) != "invalid send request: Missing required parameter(s): text" {
		t.Errorf("a request missing its text: %v %s", m.Header, m.Data)
	}
	if m := ask(`{"agent_id":"a","text":"fail"}`); m.Header.Get(micro.ErrorCodeHeader) != "404" {
		t.Errorf("a request that fails at once: %v %s", m.Header, m.Data)
	}
	pending := make(chan *nats.Msg, 1)
	go func() {
		m, _ := caller.Request("t.send", []byte(`{"agent_id":"a","text":"wait"}`), 30*time.Second)
		pending <- m
	}()
	// The endpoint takes the next request while the slow one waits.
	<-waiting
	if m := ask(`{"agent_id":"a","text":"fail"}`); m.Header.Get(micro.ErrorCodeHeader) != "404" {
		t.Errorf("a request behind a long one: %v %s", m.Header, m.Data)
	}
	close(release)
	var rep schemas.SendReply
	if m := <-pending; m == nil || json.Unmarshal(m.Data, &rep) != nil || rep.Turn != 7 {
		t.Fatalf("the slow request's answer: %v", m)
	}
	if deadline < 59*time.Minute {
		t.Errorf("the request ran within %v, want its endpoint's hour", deadline)
	}
	stats := svc.Stats()
	if n := stats.Endpoints[0].NumErrors; n != 3 {
		t.Errorf("micro counts %d errors, want the three answered at once", n)
	}
	if n := failed.n.Load(); n != 3 {
		t.Errorf("the metrics counted %d failures", n)
	}
	svc.Stop()
	srv.Wait()
}

// A request whose reply subject is long enough that answering it would
// pass the server's protocol line limit is dropped unanswered: the
// service's connection, which every request shares, stays open.
func TestLongReplySubjectsAreNotAnswered(t *testing.T) {
	b := natstest.Start(t)
	nc := natstest.Connect(t, b)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv := service.NewServer(ctx, nil, 0)
	h := service.Handler(srv, service.Endpoint[schemas.StatusRequest]{
		Verb: schemas.VerbStatus, Schema: validate.MustFull("status_request"),
		Handle: func(ctx context.Context, req schemas.StatusRequest, _ []byte) service.Reply {
			return service.Encode(schemas.AgentRecord{ID: req.AgentID}, nil)
		},
	})
	svc, err := micro.AddService(nc, micro.Config{Name: "t", Version: "0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { svc.Stop(); srv.Wait() }()
	if err := svc.AddEndpoint("status", h, micro.WithEndpointSubject("t.status")); err != nil {
		t.Fatal(err)
	}
	// The endpoint's subscription reaches the server before another
	// connection asks it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	caller := natstest.Connect(t, b)
	long := "_INBOX." + strings.Repeat("x", 4060)
	sub, err := caller.SubscribeSync(long)
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.PublishRequest("t.status", long, []byte(`{"agent_id":"a"}`)); err != nil {
		t.Fatal(err)
	}
	if m, err := caller.Request("t.status", []byte(`{"agent_id":"b"}`), 10*time.Second); err != nil || !strings.Contains(string(m.Data), `"id":"b"`) {
		t.Fatalf("the request after the long one: %v", err)
	}
	if nc.IsClosed() {
		t.Fatalf("the service's connection was closed: %v", nc.LastError())
	}
	if m, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("the long reply subject was answered: %s", m.Data)
	}
}
