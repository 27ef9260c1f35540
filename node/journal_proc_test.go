package node_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// The coordinator is killed while an agent streams as fast as it can; the
// node keeps numbering events into its outbox, then is killed too; both
// come back. Everything the node had numbered is in the stream, gapless,
// because it was on the node's disk (its journal), published again under
// its own numbers: every chunk the stand-in CLI printed before the kill,
// up to what the node had not yet read from it. With the journal deleted
// before the restart, the stream says which event numbers may have been
// lost, they are never used again, and a replay reports them as a gap.
func TestNodeJournalSurvivesTwoKills(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		name := "the journal kept"
		if deleted {
			name = "the journal deleted"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, dir := t.TempDir(), t.TempDir()
			printed := filepath.Join(t.TempDir(), "printed")
			port := freePort(t)
			b := runBrokerProcess(t, store, port)
			node, exited, stderr := startNodeProcess(t, b.url, dir, "firehose", "SHOAL_FAKE_PRINTED="+printed)
			f, err := client.NewDirect(connectTo(t, b.url), client.Config{})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the node process is up", func() bool {
				nodes, _ := f.Nodes(t.Context())
				return len(nodes) == 1
			})
			open, err := f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir()})
			if err != nil {
				t.Fatalf("open: %v\n%s", err, stderr.String())
			}
			if _, err := f.Send(t.Context(), schemas.SendRequest{AgentID: open.AgentID, Text: "go"}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the stream holds the turn's start", func() bool {
				rep, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: open.AgentID, FromEvent: 200, Max: 1, IncludeDeltas: true})
				return err == nil && len(rep.Events) == 1
			})
			b.kill()
			atKill := printedCount(printed)
			eventually(t, 60*time.Second, "the node numbers 20,000 more chunks into its outbox", func() bool {
				return printedCount(printed) > atKill+20000
			})
			node.Process.Kill()
			<-exited
			last := printedCount(printed)

			b = runBrokerProcess(t, store, port)
			if deleted {
				if err := os.RemoveAll(filepath.Join(dir, "journal")); err != nil {
					t.Fatal(err)
				}
			}
			g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, url: b.url})
			w := g.watchWith(open.AgentID, deleted) // checks the numbering: gapless, unless the journal is gone
			w.until(0, "status dead", isStatus(schemas.StatusDead))
			evs := w.events()
			chunks := 0
			for _, e := range evs {
				if a, ok := e.Payload.(schemas.AssistantText); ok && a.Delta {
					want := fmt.Sprintf("c%d ", chunks+1)
					if a.Content.Text != want {
						t.Fatalf("chunk %d in the stream is %q, want %q", chunks+1, a.Content.Text, want)
					}
					chunks++
				}
			}
			t.Logf("the CLI printed %d chunks (%d before the coordinator's kill); the stream holds %d", last, atKill, chunks)
			if !deleted {
				// What the node had not numbered yet: the pipe (64 KiB,
				// some 300 chunks) and the queue between the CLI's reader
				// and the node (256 events), and the journal's buffer (64 KiB).
				if chunks < last-2000 {
					t.Fatalf("the stream holds %d chunks of the %d the CLI printed", chunks, last)
				}
				if errs := errorsOf(evs); len(errs) != 1 || !strings.Contains(errs[0], "restarted during turn 1") {
					t.Errorf("errors: %q", errs)
				}
				return
			}
			if chunks == 0 || chunks > atKill {
				t.Fatalf("with the journal gone, the stream holds %d chunks; the coordinator was killed after %d", chunks, atKill)
			}
			var lost *schemas.Error
			var lostAt uint64
			for _, e := range evs {
				if p, ok := e.Payload.(schemas.Error); ok && strings.Contains(p.Message, "may have been lost") {
					lost, lostAt = &p, e.seq
				}
			}
			if lost == nil {
				t.Fatalf("no event says what was lost: %q", errorsOf(evs))
			}
			var rng struct {
				From uint64 `json:"lost_from"`
				To   uint64 `json:"lost_to"`
			}
			if err := jsonOf(lost.Data, &rng); err != nil || rng.To+1 != lostAt || rng.From > rng.To {
				t.Fatalf("the lost range %s, the error at %d: %v", lost.Data, lostAt, err)
			}
			var gaps []client.Gap
			if err := g.fabric.Replay(t.Context(), []string{open.AgentID}, client.From{}, false, func(_ client.Replayed, gap *client.Gap) error {
				if gap != nil {
					gaps = append(gaps, *gap)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(gaps) != 1 || gaps[0].From != rng.From || gaps[0].To != rng.To {
				t.Errorf("replay reports gaps %+v, want %d to %d", gaps, rng.From, rng.To)
			}
		})
	}
}

func printedCount(path string) int {
	b, _ := os.ReadFile(path)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func connectTo(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
