package broker_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/schemas"
)

// A store whose served account's directory is a symlink (the account's
// streams moved to another disk and linked back) is served through it by
// JetStream, and by Shoal: the link is the served account's history, not
// an empty directory to set aside for another account's older one.
func TestStoreWhoseServedAccountIsASymlinkKeepsServingIt(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	run := func(publish int) uint64 {
		t.Helper()
		b, err := broker.New(broker.Config{Port: -1, StoreDir: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Assets: broker.Assets{MaxBytes: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Shutdown()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		nc, err := b.Connect()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		for range publish {
			if _, err := js.Publish(ctx, schemas.EventSubject("a1"), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
		s, err := js.Stream(ctx, schemas.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	run(1)
	js := filepath.Join(store, "jetstream")
	// An older fabric's history under another account.
	if out, err := exec.Command("cp", "-a", filepath.Join(js, "$G"), filepath.Join(js, "AOLDKEYS")).CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	if n := run(2); n != 3 {
		t.Fatalf("the served history holds %d events, want 3", n)
	}
	// The served account's streams moved to another disk, linked back.
	elsewhere := filepath.Join(t.TempDir(), "G")
	if err := os.Rename(filepath.Join(js, "$G"), elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(js, "$G")); err != nil {
		t.Fatal(err)
	}
	if n := run(0); n != 3 {
		t.Errorf("served through a symlink, the fabric holds %d events, not the 3 it served: the link was set aside and another account's history taken up", n)
	}
}
