package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// One holder of credentials opened NATS connections until the
// coordinator had no file descriptor left: its listeners could accept
// nothing, and its store, which opens its files from the same table,
// failed its writes until `shoal up` was restarted. The server takes no
// more clients than leave the process files to spare: past that a
// client is refused, and the store goes on storing.
func TestUpKeepsFilesForItsStoreWhenClientsFloodIn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	const limit = 600 // open files the coordinator may have
	up := startCommand(t, dir, nil, []string{"bash", "-c", `ulimit -n ` + strconv.Itoa(limit) + ` && exec "$0" "$@"`,
		os.Args[0], "up", "--port", port, "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0"})
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, 2*time.Minute)
	kv, err := js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	var held []*nats.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for range limit + 100 {
		c, err := nats.Connect(url, nats.NoReconnect(), nats.Timeout(5*time.Second))
		if err != nil {
			// The server says so and closes; the client may see the
			// close first, writing its CONNECT.
			if e := strings.ToLower(err.Error()); !strings.Contains(e, "maximum connections exceeded") && !strings.Contains(e, "broken pipe") &&
				!strings.Contains(e, "connection reset") && !strings.Contains(e, "eof") {
				t.Fatalf("connection %d: %v", len(held)+1, err)
			}
			refused++
			continue
		}
		held = append(held, c)
	}
	if refused == 0 {
		t.Fatalf("all %d connections were taken by a process that may open %d files", len(held), limit)
	}
	// Every record the store keeps is written while the clients hold
	// what they were given.
	for i := range 50 {
		if _, err := kv.Put(ctx, "flood-check", []byte(strconv.Itoa(i))); err != nil {
			t.Fatalf("a write while %d clients are held: %v", len(held), err)
		}
	}
	if s := up.stderrText(); strings.Contains(s, "too many open files") {
		t.Errorf("shoal up ran out of files:\n%s", s)
	}
	t.Logf("%d clients taken, %d refused", len(held), refused)
}
