package coordinator

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// gatedStore is an object store whose first Put waits for the gate before
// it reads what is written to it (a slow JetStream); later Puts read at
// once.
type gatedStore struct {
	jetstream.ObjectStore
	gate  chan struct{}
	puts  chan int
	count int
}

func (s *gatedStore) Put(_ context.Context, meta jetstream.ObjectMeta, r io.Reader) (*jetstream.ObjectInfo, error) {
	s.count++
	n := s.count
	s.puts <- n
	if n == 1 {
		<-s.gate
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return &jetstream.ObjectInfo{ObjectMeta: meta, Size: uint64(len(b))}, nil
}

func (s *gatedStore) List(context.Context, ...jetstream.ListObjectsOpt) ([]*jetstream.ObjectInfo, error) {
	return nil, jetstream.ErrNoObjectsFound
}

// A node's chunk whose answer did not come in time (a slow store): the
// node's fetch fails, the person asks again, and the node sends the same
// bundle from 0 while the relay still writes the first copy. That chunk
// is refused as one to send again (unavailable), not as a conflict, which
// nothing sends again.
func TestRelayAsksABundleSentAgainMidWriteToComeLater(t *testing.T) {
	t.Parallel()
	b := &bundles{max: 4 << 20, reads: map[string]*bundleRead{}, writes: map[string]*bundleWrite{}}
	obs := &gatedStore{gate: make(chan struct{}), puts: make(chan int, 4)}
	ctx := context.Background()
	name := "r1/work/nb/mine/x.bundle"
	key := bundleKey("nb", "mine", name)
	data := []byte(strings.Repeat("x", 1000))
	first := make(chan error, 1)
	go func() { first <- b.write(ctx, obs, "nb", key, name, "", 0, data, true) }()
	<-obs.puts // the first copy's store has begun, and waits
	err := b.write(ctx, obs, "nb", key, name, "", 0, data, true)
	if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "being written already") {
		t.Errorf("the bundle sent again while its first copy is written: %v (code %s); want unavailable", err, schemas.CodeOf(err))
	}
	close(obs.gate)
	if err := <-first; err != nil {
		t.Errorf("the first copy: %v", err)
	}
	if err := b.write(ctx, obs, "nb", key, name, "", 0, data, true); err != nil {
		t.Errorf("the bundle sent again once the first copy is stored: %v", err)
	}
}
