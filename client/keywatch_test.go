package client_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
)

// bucket is a bucket whose entries live ttl (and the markers their
// expiry leaves as long), on b.
func watchedBucket(t *testing.T, b *broker.Broker, ttl time.Duration) jetstream.KeyValue {
	t.Helper()
	_, js := natstest.JetStream(t, b)
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "watched", TTL: ttl, LimitMarkerTTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// next is the watch's next entry, or a failure after d.
func nextKey(t *testing.T, w jetstream.KeyWatcher, d time.Duration, what string) jetstream.KeyValueEntry {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatalf("the watch ended waiting for %s", what)
		}
		return e
	case <-time.After(d):
		t.Fatalf("no entry in %v waiting for %s", d, what)
	}
	return nil
}

func describeKey(e jetstream.KeyValueEntry) string {
	if e == nil {
		return "nil"
	}
	return e.Key() + " " + e.Operation().String()
}

// The server restarts under a watch: it goes on, from the entry after
// the last it passed on, with no entry twice and no second nil. An entry
// written just after the restart lives 2s, and so does the marker its
// expiry leaves: both are passed on, so the watch was back within that,
// not when nats.go's watch missed its heartbeats (10 to 20 seconds). It
// says its connection came back before it passes on anything after.
func TestKeyWatchGoesOnAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	watchedBucket(t, b, 2*time.Second)
	nc := natstest.Connect(t, b, nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	kv, err := jsOn(t, nc).KeyValue(t.Context(), "watched")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "before", []byte("1")); err != nil {
		t.Fatal(err)
	}
	w, err := client.WatchAllKeys(t.Context(), nc, kv)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, want := range []string{"before KeyValuePutOp", "nil"} {
		if got := describeKey(nextKey(t, w, 10*time.Second, want)); got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
	}

	select {
	case <-w.Reconnected():
		t.Fatal("the watch said its connection came back before it went")
	default:
	}

	going := time.Now()
	b = natstest.Restart(t, b)
	poll.Until(t, 30*time.Second, "the watch's connection is back", func() bool { return nc.IsConnected() && nc.Stats().Reconnects > 0 })
	if _, err := watchedBucket(t, b, 2*time.Second).Put(t.Context(), "after", []byte("2")); err != nil {
		t.Fatal(err)
	}
	// "before" expires about when "after" is written: its marker comes
	// before or after "after", but once.
	var (
		got  []string
		lost time.Time
	)
	for len(got) < 3 {
		e := nextKey(t, w, 30*time.Second, "the entries written after the restart")
		got = append(got, describeKey(e))
		if len(got) == 1 {
			// Said before any entry of the watch made again.
			select {
			case lost = <-w.Reconnected():
			default:
				t.Fatalf("the watch passed on %s after the restart without saying its connection came back", got[0])
			}
		}
		// It says when the connection went: before "after" was made,
		// though it is read here after that (a time taken as it is
		// read would not be).
		if describeKey(e) == "after KeyValuePutOp" && (lost.Before(going) || !lost.Before(e.Created())) {
			t.Errorf("the watch says its connection went at %v, not after the restart began (%v) and before %q was made (%v)",
				lost, going, e.Key(), e.Created())
		}
	}
	rest := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return s == "before KeyValuePurgeOp" })
	if len(rest) != 2 || rest[0] != "after KeyValuePutOp" || rest[1] != "after KeyValuePurgeOp" {
		t.Fatalf("after the restart the watch passed on %q, want before's expiry, and after's put then its expiry", got)
	}
	select {
	case e := <-w.Updates():
		t.Fatalf("after %q the watch passed on %s", got, describeKey(e))
	case <-time.After(500 * time.Millisecond):
	}
}

func jsOn(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// The watch's channel closes when its connection is closed for good, and
// when it is stopped.
func TestKeyWatchEnds(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	watchedBucket(t, b, time.Minute)
	for _, how := range []string{"closed", "stopped"} {
		nc := natstest.Connect(t, b)
		kv, err := jsOn(t, nc).KeyValue(t.Context(), "watched")
		if err != nil {
			t.Fatal(err)
		}
		w, err := client.WatchAllKeys(t.Context(), nc, kv)
		if err != nil {
			t.Fatal(err)
		}
		if e := nextKey(t, w, 10*time.Second, "the initial nil"); e != nil {
			t.Fatalf("%s: got %s first", how, describeKey(e))
		}
		if how == "closed" {
			nc.Close()
		} else {
			w.Stop()
		}
		select {
		case e, ok := <-w.Updates():
			if ok {
				t.Fatalf("%s: got %s", how, describeKey(e))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the watch goes on with its connection %s", how)
		}
		w.Stop()
	}
}
