package broker_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/schemas"
)

// A store keeps its history whoever serves it: turning --auth on, making
// new keys (a new --auth-dir, as withdrawing a leaked credential takes)
// and turning --auth off again each served the fabric from an account
// directory of its own, so the server started empty beside the history
// and said nothing. Each now takes up what the store holds, and says so;
// a store holding the fabric under several other accounts is refused.
func TestStoreKeepsItsHistoryAcrossAuthAndKeys(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	var logged bytes.Buffer
	run := func(auth *broker.Authority, check func(js jetstream.JetStream)) error {
		t.Helper()
		b, err := broker.New(broker.Config{Port: -1, StoreDir: store, Auth: auth, Logger: slog.New(slog.NewTextHandler(&logged, nil)),
			Assets: broker.Assets{MaxBytes: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Shutdown()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := b.Start(ctx); err != nil {
			return err
		}
		nc, err := b.Connect()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		check(js)
		return nil
	}
	held := func(what string) func(jetstream.JetStream) {
		return func(js jetstream.JetStream) {
			t.Helper()
			s, err := js.Stream(t.Context(), schemas.StreamName)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 1 {
				t.Errorf("%s: the stream holds %d events, want the 1 stored first", what, info.State.Msgs)
			}
			kv, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Get(t.Context(), "a1"); err != nil {
				t.Errorf("%s: agent a1's record: %v", what, err)
			}
		}
	}
	keys := func(name string) *broker.Authority {
		a, err := broker.OpenAuthority(filepath.Join(t.TempDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	if err := run(nil, func(js jetstream.JetStream) {
		if _, err := js.Publish(t.Context(), schemas.EventSubject("a1"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(t.Context(), "a1", []byte(`{"id":"a1"}`)); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		what string
		auth *broker.Authority
	}{
		{"--auth turned on", keys("k1")},
		{"new keys", keys("k2")},
		{"--auth turned off", nil},
	} {
		logged.Reset()
		if err := run(step.auth, held(step.what)); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if !strings.Contains(logged.String(), "every event, record and bundle of it kept") {
			t.Errorf("%s: the server did not say it took up the history: %s", step.what, logged.String())
		}
	}
	// Served as it was, nothing more is said.
	logged.Reset()
	if err := run(nil, held("a restart as it was")); err != nil {
		t.Fatal(err)
	}
	if logged.Len() != 0 && strings.Contains(logged.String(), "account") {
		t.Errorf("a restart as it was said: %s", logged.String())
	}

	// The fabric under two accounts and neither served: refused, naming
	// both, and nothing moved.
	other := filepath.Join(store, "jetstream", "AOTHER", "streams", schemas.StreamName)
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	err := run(keys("k3"), func(jetstream.JetStream) { t.Error("a server started on a store of two fabrics") })
	if err == nil || !strings.Contains(err.Error(), "several accounts ($G, AOTHER)") || schemas.CodeOf(err) != schemas.CodeInvalid {
		t.Errorf("a store of two fabrics: %v", err)
	}
	if _, err := os.Stat(filepath.Join(store, "jetstream", "$G", "streams", schemas.StreamName)); err != nil {
		t.Errorf("the refused start moved the history: %v", err)
	}
	// Served with its own and another's: started, and the other named.
	logged.Reset()
	if err := run(nil, held("a store that also holds another's")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "also holds a fabric's history under account AOTHER") {
		t.Errorf("the other account's history was not named: %s", logged.String())
	}
}
