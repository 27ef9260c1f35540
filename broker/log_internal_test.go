package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A store whose disk filled stopped the whole fabric with only the
// server's own lines in the log ("Filestore [AGENTS] Critical write
// error: … no space left on device"), and freeing space did not bring it
// back: the log says, in Shoal's words and once a minute, what happened
// and what to do (an outside chaos test filled a tmpfs under the store;
// the unit stands in for the disk, which a test cannot fill safely).
func TestAFullStoreIsSaidOnce(t *testing.T) {
	var out bytes.Buffer
	s := newServerLog(slog.New(slog.NewTextHandler(&out, nil)))
	s.store = "/var/lib/shoal/jetstream"
	for range 50 {
		s.Errorf("Filestore [%s] Critical write error: %v", "AGENTS", "write /var/lib/shoal/jetstream/jetstream/$G/streams/AGENTS/msgs/1.blk: no space left on device")
	}
	if n := strings.Count(out.String(), "the fabric's store is out of disk space"); n != 1 {
		t.Errorf("the log says the store is full %d times for 50 failed writes; want once:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "then restart shoal up") || !strings.Contains(out.String(), "/var/lib/shoal/jetstream") {
		t.Errorf("the log does not say where and what to do:\n%s", out.String())
	}
}
