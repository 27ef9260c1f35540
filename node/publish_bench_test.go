package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// BenchmarkPublishEvents is the node's work for each event between its
// envelope and the wire: numbering it into the outbox, writing it to the
// journal, making its message and sending it in a fast batch, and taking
// its acknowledgement. The stream is a stand-in that acknowledges every
// flow's worth of events as the server does, so what is measured (CPU
// and allocations per event) is the node's own, not nats.go's or the
// server's.
func BenchmarkPublishEvents(b *testing.B) {
	log := slog.New(slog.DiscardHandler)
	j, _, err := openJournal(b.TempDir(), log)
	if err != nil {
		b.Fatal(err)
	}
	acks := make(chan *nats.Msg, 1024)
	s := &batchSender{prefix: schemas.BatchAckPrefix + ".bench", flow: batchFlow, wait: time.Minute, done: make(chan struct{})}
	s.settled, s.resolved = sync.NewCond(&s.mu), sync.NewCond(&s.mu)
	s.commit = time.AfterFunc(time.Hour, s.commitNow)
	s.commit.Stop()
	s.sub = &nats.Subscription{}
	var sent uint64
	s.publish = func(m *nats.Msg) error {
		// The stream acknowledges each flow's worth, and a commit.
		sent++
		if sent%batchFlow == 0 || m.Subject == schemas.BatchEndSubject {
			n := sent
			if m.Subject == schemas.BatchEndSubject {
				n--
			}
			acks <- &nats.Msg{Subject: m.Reply, Data: fmt.Appendf(nil, `{"type":"ack","seq":%d}`, n)}
			if m.Subject == schemas.BatchEndSubject {
				sent = 0
			}
		}
		return nil
	}
	go func() {
		for m := range acks {
			s.reply(m)
		}
	}()
	p := newPublisher(s, func(context.Context, []string) (map[string]uint64, error) { return nil, nil }, 512, outboxLimits{Memory: 64 << 20}, nil, log)
	p.useJournal(j)
	ctx, cancel := context.WithCancel(b.Context())
	journalDone, pubDone := make(chan struct{}), make(chan struct{})
	go func() { j.run(); close(journalDone) }()
	go func() { p.run(ctx); close(pubDone) }()
	defer func() { cancel(); <-pubDone; j.close(); <-journalDone; close(acks) }()

	env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("hello, world")}})
	subject := schemas.EventSubject("bench")
	b.ReportAllocs()
	b.ResetTimer()
	before := cpuTime()
	for i := range b.N {
		p.hold(ctx)
		p.enqueue(newOutMsg(subject, "node", "bench", uint64(i+1), env, time.Now()))
	}
	if err := p.flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/event")
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var u syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
