package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// A confined node's bundles are held to twice the largest one in all,
// counting what each takes beyond its bytes: the relay stored the
// description (and name) a node's chunk header gave, unbounded, and
// counted a bundle by its size alone, so a node writing empty bundles,
// each described by most of a megabyte, filled the repositories' store
// past its room, and every caller's open failed for a day.
func TestRelayHoldsANodesBundleDescriptionsToItsRoom(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20 // the node's room: 2 MiB
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) { c.MaxBundle = limit })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)
	put := func(name string) error {
		t.Helper()
		m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayBundlePut, "mine"))
		m.Header.Set(schemas.HeaderBundle, name)
		m.Header.Set(schemas.HeaderBundleOffset, "0")
		m.Header.Set(schemas.HeaderBundleLast, "1")
		m.Header.Set(schemas.HeaderBundleDescription, strings.Repeat("d", 900<<10))
		rep, err := w.nc.RequestMsg(m, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var none struct{}
		return schemas.DecodeReply(rep.Data, &none)
	}
	if err := put("r1/work/nb/mine/" + strings.Repeat("n", 200) + ".bundle"); err == nil || !strings.Contains(err.Error(), "at most 128") {
		t.Errorf("a bundle named 200 bytes past its prefix: %v", err)
	}
	stored := 0
	var refused error
	for i := range 48 {
		if refused = put(fmt.Sprintf("r1/work/nb/mine/empty-%d.bundle", i)); refused != nil {
			break
		}
		stored++
	}
	if refused == nil || !strings.Contains(refused.Error(), "the most a node's may") {
		t.Errorf("after %d empty bundles the node's next was not refused for its room: %v", stored, refused)
	}
	st, err := s.F.JetStream().Stream(ctx, "OBJ_"+schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node nb stored %d empty bundles; the repositories' store holds %d bytes", stored, info.State.Bytes)
	if room := uint64(2 * limit); info.State.Bytes > room {
		t.Errorf("one node's empty bundles take %d bytes of the repositories' store, past its room of %d (twice the largest bundle)", info.State.Bytes, room)
	}
}
