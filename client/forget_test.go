package client_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A forgotten agent's record leaves one marker in the bucket, which
// still says the record, and which goes when the stream's events of the
// agent go: an agent opened once costs the bucket nothing for good. The
// bucket is provisioned again (every `shoal up` does) with its setting.
func TestAForgottenRecordGoesWithItsEvents(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t, func(c *broker.Config) { c.Assets.MaxAge, c.Assets.Duplicates = 3*time.Second, time.Second })
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, time.Minute)
	if err := broker.Provision(ctx, js, broker.Assets{MaxAge: 3 * time.Second, Duplicates: time.Second}); err != nil {
		t.Fatalf("provisioning again: %v", err)
	}
	kv, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "gone", Status: schemas.StatusDead, Model: "m1", Node: "n1"})
	var rev uint64
	for range 3 {
		if rev, err = kv.Put(ctx, "gone", rec); err != nil {
			t.Fatal(err)
		}
	}
	ttl, err := client.ForgottenTTL(ctx, js)
	if err != nil || ttl != 3*time.Second {
		t.Fatalf("the marker's TTL: %v %v, want the stream's age limit, 3s", ttl, err)
	}
	if _, err := js.PublishMsg(ctx, client.ForgetRecord("gone", rec, rev-1, ttl)); err == nil {
		t.Fatal("a marker held to a revision not the key's last was stored")
	}
	if _, err := js.PublishMsg(ctx, client.ForgetRecord("gone", rec, rev, ttl)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "gone"); err != jetstream.ErrKeyNotFound {
		t.Errorf("the forgotten key reads %v, want not found", err)
	}
	hist, err := kv.History(ctx, "gone")
	if err != nil || len(hist) != 1 || hist[0].Operation() != jetstream.KeyValueDelete || string(hist[0].Value()) != string(rec) {
		t.Fatalf("the forgotten key's history: %d entries, %v", len(hist), err)
	}
	recs, err := js.Stream(ctx, "KV_"+schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the marker to go with the stream's age limit", func() bool {
		info, err := recs.Info(ctx, jetstream.WithSubjectFilter("$KV."+schemas.AgentsBucket+".gone"))
		return err == nil && info.State.Msgs == 0
	})
}
