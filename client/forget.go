package client

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// A dead agent's record is forgotten (deleted from the agents bucket)
// once its node keeps it no longer. A plain delete leaves the key's
// earlier revisions and its marker in the bucket for good: every agent
// ever opened went on costing the bucket a few KB, and every read of
// the bucket a marker. The record is forgotten instead with a delete
// marker that carries it (so an agent's status still says its model,
// cwd and event log while its events are kept: Direct.prunedRecord),
// rolls up the key's earlier revisions, and expires with the events the
// stream keeps of it (the AGENTS stream's age limit), where the server
// takes per-message TTLs.

// ForgetRecord is the message that forgets agent id's record, whose
// revision rev holds last: a delete marker carrying last, which takes
// the place of every earlier revision of the key, held to rev, and gone
// after ttl (kept for good when ttl is zero).
func ForgetRecord(id string, last []byte, rev uint64, ttl time.Duration) *nats.Msg {
	h := nats.Header{}
	h.Set("KV-Operation", "DEL")
	h.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if ttl > 0 {
		h.Set(jetstream.MsgTTLHeader, strconv.FormatInt(int64(ttl/time.Second), 10))
	}
	return &nats.Msg{Subject: "$KV." + schemas.AgentsBucket + "." + id, Header: h, Data: last}
}

// Forget forgets agent id's record at revision rev, whose value is last
// (nil for a claim no node took up, which says nothing worth keeping).
func Forget(ctx context.Context, js jetstream.JetStream, id string, last []byte, rev uint64) error {
	ttl, err := ForgottenTTL(ctx, js)
	if err != nil {
		return err
	}
	_, err = js.PublishMsg(ctx, ForgetRecord(id, last, rev, ttl))
	return err
}

// ForgottenTTL is how long a forgotten record's marker is kept: as long
// as the stream keeps events (its age limit), or zero (for good) where
// the stream keeps them for good or the agents bucket takes no
// per-message TTLs (a server before 2.11, or a bucket made by one).
func ForgottenTTL(ctx context.Context, js jetstream.JetStream) (time.Duration, error) {
	events, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return 0, err
	}
	agents, err := js.Stream(ctx, "KV_"+schemas.AgentsBucket)
	if err != nil {
		return 0, err
	}
	maxAge := events.CachedInfo().Config.MaxAge
	if !agents.CachedInfo().Config.AllowMsgTTL || maxAge <= 0 {
		return 0, nil
	}
	return max(maxAge, time.Second), nil
}

// EndClaim ends rec, a claim no node took up, at revision rev: it is
// forgotten, or, when it carries the id's earlier lives (what they used,
// where their numbering ended, which a forgotten claim would lose), it is
// written dead, and the id's next open carries them on from it.
func EndClaim(ctx context.Context, js jetstream.JetStream, rec schemas.AgentRecord, rev uint64) error {
	if rec.UsageBefore == nil && rec.EventsBefore == 0 && rec.TurnsBefore == 0 {
		return Forget(ctx, js, rec.ID, nil, rev)
	}
	kv, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return err
	}
	rec.Status = schemas.StatusDead
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = kv.Update(ctx, rec.ID, b, rev)
	return err
}
