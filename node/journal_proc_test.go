package node_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/freeport"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
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
	for _, damage := range []string{"kept", "deleted", "cut short", "failed"} {
		deleted := damage != "kept" // numbers may be missing either way
		t.Run("the journal "+damage, func(t *testing.T) {
			t.Parallel()
			store, dir := t.TempDir(), t.TempDir()
			printed := filepath.Join(t.TempDir(), "printed")
			port := freePort(t)
			b := runBrokerProcess(t, store, port)
			fh := startFirehose(t, b.url, dir, printed, 200)
			node, exited, open := fh.node, fh.exited, fh.open
			b.kill()
			atKill := printedCount(printed)
			poll.Until(t, 60*time.Second, "the node numbers 20,000 more chunks into its outbox", func() bool {
				return printedCount(printed) > atKill+20000
			})
			node.Process.Kill()
			<-exited
			last := printedCount(printed)

			// What the node had reserved of the agent's numbers when it was
			// killed: the most a restart may name as lost.
			var nums struct {
				Marks map[string]uint64 `json:"marks"`
			}
			if b, err := os.ReadFile(filepath.Join(dir, "numbers.json")); err != nil || json.Unmarshal(b, &nums) != nil {
				t.Fatalf("the numbers file: %s %v", b, err)
			}
			mark := nums.Marks[open.AgentID]

			b = runBrokerProcess(t, store, port)
			switch damage {
			case "deleted":
				if err := os.RemoveAll(filepath.Join(dir, "journal")); err != nil {
					t.Fatal(err)
				}
			case "cut short":
				cutJournal(t, filepath.Join(dir, "journal"))
			case "failed":
				// A write of it failed (a full disk), as journal.failed
				// marks it: what it held went on without it.
				boots, _ := filepath.Glob(filepath.Join(dir, "journal", "*.boot"))
				if len(boots) == 0 {
					t.Fatal("the journal has no boot file to mark")
				}
				for _, f := range boots {
					if err := os.WriteFile(f, []byte("failed"), 0o600); err != nil {
						t.Fatal(err)
					}
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
			if damage == "deleted" && (chunks == 0 || chunks > atKill) {
				t.Fatalf("with the journal gone, the stream holds %d chunks; the coordinator was killed after %d", chunks, atKill)
			}
			var lost *schemas.Error
			var lostAt, before uint64 // the lost range's error, and the last event of the run killed
			restarted := false
			for _, e := range evs {
				p, ok := e.Payload.(schemas.Error)
				switch {
				case ok && strings.Contains(p.Message, "may have been lost"):
					lost, lostAt = &p, e.seq
				case ok && strings.Contains(p.Message, "restarted during turn"):
					restarted = true
				case lost == nil && !restarted:
					before = e.seq
				}
			}
			if lost == nil && damage == "failed" && before == mark {
				// The node was killed as it reserved the next block of
				// numbers (a synced write): everything it numbered is in
				// the journal and stored, and no number may have been
				// used past them. Nothing is named, and nothing is
				// missing.
				if chunks < last-2000 {
					t.Fatalf("the stream holds %d chunks of the %d the CLI printed", chunks, last)
				}
				return
			}
			if lost == nil {
				t.Fatalf("no event says what was lost: %q (the node's last reserved number %d, the last stored before the restart %d)", errorsOf(evs), mark, before)
			}
			var rng struct {
				From uint64 `json:"lost_from"`
				To   uint64 `json:"lost_to"`
			}
			if err := jsonOf(lost.Data, &rng); err != nil || rng.To+1 != lostAt || rng.From > rng.To || rng.To != mark {
				t.Fatalf("the lost range %s, the error at %d, the node's last reserved number %d: %v", lost.Data, lostAt, mark, err)
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

// firehose is a node process and its agent (for startFirehose, one that
// streams as fast as it can).
type firehose struct {
	node   *exec.Cmd
	exited <-chan struct{}
	stderr *strings.Builder
	open   schemas.OpenReply
}

// startFirehose starts a node process on the fabric at url, its files
// in dir, opens an agent on it whose stand-in CLI counts what it printed
// in printed, sends it a turn, and returns once the stream holds the
// turn's event number events.
func startFirehose(t *testing.T, url, dir, printed string, events uint64) firehose {
	t.Helper()
	fh, f := startAgentProcess(t, url, dir, "firehose", "SHOAL_FAKE_PRINTED="+printed)
	open := fh.open
	if _, err := f.Send(t.Context(), schemas.SendRequest{AgentID: open.AgentID, Text: "go"}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, fmt.Sprintf("the stream holds the turn's event %d", events), func() bool {
		rep, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: open.AgentID, FromEvent: events, Max: 1, IncludeDeltas: true})
		return err == nil && len(rep.Events) == 1
	})
	return fh
}

// startAgentProcess starts a node process on the fabric at url, its files
// in dir, its stand-in CLI in mode, and opens an agent on it; it returns
// them, and a client of the fabric.
func startAgentProcess(t *testing.T, url, dir, mode string, env ...string) (firehose, *client.Direct) {
	t.Helper()
	node, exited, stderr := startNodeProcess(t, url, dir, mode, env...)
	f, err := client.NewDirect(connectTo(t, url), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := f.Nodes(t.Context())
		return len(nodes) == 1
	})
	open, err := f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatalf("open: %v\n%s", err, stderr.String())
	}
	return firehose{node: node, exited: exited, stderr: stderr, open: open}, f
}

// cutJournal cuts the largest segment of a journal in the middle of a
// record, as a damaged disk would.
func cutJournal(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var biggest string
	var size int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".seg") && info.Size() > size {
			biggest, size = filepath.Join(dir, e.Name()), info.Size()
		}
	}
	if size < 1024 {
		t.Fatalf("the journal has no segment to cut (largest %d bytes)", size)
	}
	// An odd offset a little past the half: inside a record, not at its end.
	if err := os.Truncate(biggest, size/2+7); err != nil {
		t.Fatal(err)
	}
}

func printedCount(path string) int {
	b, _ := os.ReadFile(path)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func freePort(t *testing.T) int { return freeport.Take(t) }

func connectTo(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// An agent closed by a restart's recovery (its node killed mid-life),
// then its node killed again and its journal deleted: the third start
// reports no loss for it, since the recovery's closing events were its
// last and the numbers file says so exactly (it kept the block reserved
// for them, and a gap of numbers never used was reported after the
// agent's status dead).
func TestNoFalseLossAfterRecovery(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	node, exited, stderr := startNodeProcess(t, b.ClientURL(), dir, "echo")
	poll.Until(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := f.Nodes(ctx)
		return len(nodes) == 1
	})
	open, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatalf("open: %v\n%s", err, stderr.String())
	}
	if _, err := f.Run(ctx, schemas.RunRequest{AgentID: open.AgentID, Text: "hello"}); err != nil {
		t.Fatal(err)
	}
	node.Process.Kill()
	<-exited
	node, exited, _ = startNodeProcess(t, b.ClientURL(), dir, "echo")
	var last uint64
	poll.Until(t, 30*time.Second, "the restart's recovery closes the agent", func() bool {
		rep, err := f.Events(ctx, schemas.EventsRequest{AgentID: open.AgentID, IncludeDeltas: true})
		if err != nil || len(rep.Events) == 0 {
			return false
		}
		ev := rep.Events[len(rep.Events)-1]
		last = ev.N
		return strings.Contains(string(ev.Event), `"kind":"status"`) && strings.Contains(string(ev.Event), `"dead"`)
	})
	// The recovery settles the agent's mark once its closing events are
	// stored: a kill in between leaves the block's end, which a lost
	// journal then rightly reports as numbers that may have been used.
	poll.Until(t, 30*time.Second, "the recovery settles the agent's mark", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "numbers.json"))
		var nums struct {
			Marks map[string]uint64 `json:"marks"`
		}
		return err == nil && json.Unmarshal(b, &nums) == nil && nums.Marks[open.AgentID] == last
	})
	node.Process.Kill()
	<-exited
	if err := os.RemoveAll(filepath.Join(dir, "journal")); err != nil {
		t.Fatal(err)
	}
	startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, broker: b})
	rep, err := f.Events(ctx, schemas.EventsRequest{AgentID: open.AgentID, IncludeDeltas: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := rep.Events[len(rep.Events)-1]; e.N != last || len(rep.Gaps) != 0 {
		t.Errorf("after the journal was deleted the agent's stream goes on to event %d (%s) past its status dead at %d; gaps %+v", e.N, e.Event, last, rep.Gaps)
	}
}

// A node stopped cleanly (SIGTERM: its agents closed, every event
// stored), its journal then deleted: the next start reports no loss.
func TestNoLossAfterACleanStop(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	node, exited, stderr := startNodeProcess(t, b.ClientURL(), dir, "echo")
	poll.Until(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := f.Nodes(ctx)
		return len(nodes) == 1
	})
	open, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatalf("open: %v\n%s", err, stderr.String())
	}
	if _, err := f.Run(ctx, schemas.RunRequest{AgentID: open.AgentID, Text: "hello"}); err != nil {
		t.Fatal(err)
	}
	node.Process.Signal(syscall.SIGTERM)
	<-exited
	before, err := f.Events(ctx, schemas.EventsRequest{AgentID: open.AgentID, IncludeDeltas: true})
	if err != nil || len(before.Events) == 0 {
		t.Fatalf("the stream after the clean stop: %+v %v", before, err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "journal")); err != nil {
		t.Fatal(err)
	}
	startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, broker: b})
	after, err := f.Events(ctx, schemas.EventsRequest{AgentID: open.AgentID, IncludeDeltas: true})
	if err != nil || len(after.Events) != len(before.Events) || len(after.Gaps) != 0 {
		t.Errorf("after the journal of a clean stop was deleted: %d events (was %d), gaps %+v, %v; the last: %s",
			len(after.Events), len(before.Events), after.Gaps, err, after.Events[len(after.Events)-1].Event)
	}
}

// A node SIGKILLed while an agent streams as fast as it can, its events
// going out in fast batches (the server storing each as it comes, a
// batch not atomic), and restarted: the batch cut mid-way leaves no gap
// and no duplicate. What the stream stored of it stays; what it did not
// comes from the node's journal, under the same numbers; nothing is
// stored twice.
func TestBatchCutByASIGKILL(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	printed := filepath.Join(t.TempDir(), "printed")
	fh := startFirehose(t, b.ClientURL(), dir, printed, 20000)
	node, exited, stderr, open := fh.node, fh.exited, fh.stderr, fh.open
	node.Process.Kill()
	<-exited
	if !strings.Contains(stderr.String(), "events are published in fast batches") {
		t.Fatalf("the node did not publish in fast batches:\n%s", stderr.String())
	}
	last := printedCount(printed)

	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, url: b.ClientURL()})
	w := g.watchWith(open.AgentID, false) // checks the numbering: gapless
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	chunks := 0
	for _, e := range w.events() {
		if a, ok := e.Payload.(schemas.AssistantText); ok && a.Delta {
			if want := fmt.Sprintf("c%d ", chunks+1); a.Content.Text != want {
				t.Fatalf("chunk %d in the stream is %q, want %q", chunks+1, a.Content.Text, want)
			}
			chunks++
		}
	}
	t.Logf("the CLI printed %d chunks; the stream holds %d, each once", last, chunks)
	// What the node had not numbered yet: the pipe, the queue between the
	// CLI's reader and the node, and the journal's buffer.
	if chunks < last-2000 {
		t.Fatalf("the stream holds %d chunks of the %d the CLI printed", chunks, last)
	}
	if errs := errorsOf(w.events()); len(errs) != 1 || !strings.Contains(errs[0], "restarted during turn 1") {
		t.Errorf("errors: %q", errs)
	}
}
