package node

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

func journalMsg(agent string, seq uint64) *outMsg {
	return &outMsg{agent: agent, seq: seq, subject: "agent." + agent, data: []byte(`{"kind":"turn_started","turn":1,"data":{}}`),
		header: nats.Header{"Nats-Msg-Id": {agent + "." + string(rune('0'+seq%10))}}}
}

// A journal gives back, after a crash, what it had written, in order; a
// record cut short by the crash ends what is read; records acknowledged
// are removed with their segments; a clean close leaves nothing.
func TestJournalRecovery(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	j, prev, err := openJournal(dir, log)
	if err != nil || len(prev.events) != 0 {
		t.Fatalf("a new journal: %v %v", prev.events, err)
	}
	go j.run()
	t.Cleanup(j.close) // the crash below leaves it open
	for i := range 5 {
		j.append(journalMsg("a", uint64(i+1)))
	}
	if err := j.syncNow(); err != nil {
		t.Fatal(err)
	}
	// A crash: the process is gone without closing; half a record is left.
	seg := j.seg.Name()
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(appendRecord(nil, 6, journalMsg("a", 6))[:20])
	f.Close()

	j2, prev, err := openJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(prev.events) != 5 || prev.events[0].seq != 1 || prev.events[4].seq != 5 || !prev.ids[j.id] {
		t.Fatalf("recovered %d events, ids %v", len(prev.events), prev.ids)
	}
	go j2.run()
	for _, m := range prev.events {
		j2.append(m)
	}
	j2.syncNow()
	j2.removeOld(prev.segments)
	if _, err := os.Stat(seg); !os.IsNotExist(err) {
		t.Errorf("the replayed segment is still there: %v", err)
	}
	j2.retire(5)
	j2.close()
	names, _ := segmentNames(dir)
	if len(names) != 0 {
		t.Errorf("a clean close left %v", names)
	}
	// What says each journal's boot goes with its segments: opened again,
	// the directory holds the new journal's alone.
	j3, _, err := openJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if boots, _ := filepath.Glob(filepath.Join(dir, "*.boot")); len(boots) != 1 || boots[0] != bootFile(dir, j3.id) {
		t.Errorf("the journal's boots after a reopen: %v; want only %s", boots, bootFile(dir, j3.id))
	}
	go j3.run()
	j3.close()
	// The numbers file is apart from the journal.
	nums, prevNums, err := openNumbers(filepath.Join(t.TempDir(), "numbers.json"), "x")
	if err != nil || len(prevNums.Marks) != 0 {
		t.Fatal(err)
	}
	nums.reserve("a", 1)
	nums.reserve("a", 2)
	if nums.marks["a"] != numbersBlock {
		t.Errorf("reserved up to %d", nums.marks["a"])
	}
	// A fast stream reserves more at a time, up to a bound.
	nums.reserve("a", 20_001)
	if nums.marks["a"] != 25_000 {
		t.Errorf("at event 20,001, reserved up to %d", nums.marks["a"])
	}
	nums.reserve("a", 100_001)
	if nums.marks["a"] != 100_000+maxNumbersBlock {
		t.Errorf("at event 100,001, reserved up to %d", nums.marks["a"])
	}
}

// Many agents needing a block at once share the file's syncs, and each
// reserve returns only once the file holds its block: read back, the file
// has every agent's mark.
func TestNumbersReservedTogetherAreAllSaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "numbers.json")
	nums, _, err := openNumbers(path, "j")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			agent := fmt.Sprintf("a%d", i)
			for _, seq := range []uint64{1, numbersBlock + 1, 5 * numbersBlock} {
				if err := nums.reserve(agent, seq); err != nil {
					errs <- err
					return
				}
				// Returned: the block is in the file.
				b, err := os.ReadFile(path)
				var f numbersFile
				if err != nil || json.Unmarshal(b, &f) != nil || f.Marks[agent] < seq {
					errs <- fmt.Errorf("%s reserved %d, the file says %d (%v)", agent, seq, f.Marks[agent], err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	_, prev, err := openNumbers(path, "j2")
	if err != nil || prev.Journal != "j" || len(prev.Marks) != 200 {
		t.Fatalf("read back: journal %q, %d marks, %v", prev.Journal, len(prev.Marks), err)
	}
}

// The numbers file and pids.json are written without encoding/json; what
// they write reads back, through encoding/json, as what was written,
// whatever the keys and values hold.
func TestNodeFilesReadBackAsWritten(t *testing.T) {
	odd := []string{"", "a", "ab-1_2", `quote"back\slash`, "ctl\x00\x01\n\t", "<html>&", "\u2028\u2029", "naïve ☃", "bad\xffutf8"}
	for _, marks := range []map[string]uint64{{}, {"a": 1}, {"x": 1 << 63, "y": 0, "z": 18446744073709551615}} {
		for i, k := range odd {
			if len(marks) > 1 {
				marks[k] = uint64(i) * 1e15
			}
		}
		for _, journal := range odd {
			f := numbersFile{Journal: journal, Marks: marks}
			var got numbersFile
			if err := json.Unmarshal(f.appendJSON(nil), &got); err != nil {
				t.Fatalf("%q: %v", f.appendJSON(nil), err)
			}
			want, _ := json.Marshal(f)
			var wantBack numbersFile
			json.Unmarshal(want, &wantBack)
			if !reflect.DeepEqual(got, wantBack) {
				t.Fatalf("numbers file %q read back as %+v, want %+v", f.appendJSON(nil), got, wantBack)
			}
		}
	}
	pids := map[string]pidEntry{}
	for i, k := range odd {
		pids[k] = pidEntry{PID: i * 1000, Start: odd[(i+1)%len(odd)], Life: odd[(i+2)%len(odd)]}
	}
	pids["none"] = pidEntry{}
	for _, m := range []map[string]pidEntry{{}, {"one": {PID: 7}}, pids} {
		var got map[string]pidEntry
		if err := json.Unmarshal(appendPids(nil, m), &got); err != nil {
			t.Fatalf("%q: %v", appendPids(nil, m), err)
		}
		want, _ := json.Marshal(m)
		var wantBack map[string]pidEntry
		json.Unmarshal(want, &wantBack)
		if !reflect.DeepEqual(got, wantBack) {
			t.Fatalf("pids.json %q read back as %+v, want %+v", appendPids(nil, m), got, wantBack)
		}
	}
}

// A kill's write cut short ends at a page boundary (the kernel stops a
// write for a fatal signal only between pages): that is the journal's
// window, not damage, and nothing is said lost for it. A segment cut
// anywhere else (a truncate), or in another boot (a power loss, after
// which the disk may end a file at any page), is damage.
func TestJournalTellsAKillsTornWriteFromDamage(t *testing.T) {
	page := int64(os.Getpagesize())
	for _, c := range []struct {
		name     string
		cut      func(size int64) int64
		rebooted bool
		damaged  bool
	}{
		{"cut at the page boundary inside the last record", func(size int64) int64 { return size / page * page }, false, false},
		{"cut at an odd offset inside it", func(size int64) int64 { return size/page*page + 7 }, false, true},
		{"cut at the page boundary, in another boot", func(size int64) int64 { return size / page * page }, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			log := slog.New(slog.DiscardHandler)
			j, _, err := openJournal(dir, log)
			if err != nil {
				t.Fatal(err)
			}
			go j.run()
			t.Cleanup(j.close)
			seg := j.seg.Name()
			// Records until one crosses a page boundary by more than the
			// odd offset.
			n, before := uint64(0), int64(0)
			for {
				n++
				j.append(journalMsg("a", n))
				if err := j.syncNow(); err != nil {
					t.Fatal(err)
				}
				fi, _ := os.Stat(seg)
				if before/page < fi.Size()/page && fi.Size()%page > 8 {
					break
				}
				before = fi.Size()
			}
			fi, _ := os.Stat(seg)
			if err := os.Truncate(seg, c.cut(fi.Size())); err != nil {
				t.Fatal(err)
			}
			if c.rebooted {
				os.WriteFile(bootFile(dir, j.id), []byte("another boot"), 0o600)
			}
			got, err := readJournal(dir, log)
			if err != nil {
				t.Fatal(err)
			}
			if got.damaged != c.damaged {
				t.Errorf("damaged = %v, want %v", got.damaged, c.damaged)
			}
			if len(got.events) == 0 || got.events[len(got.events)-1].seq >= n {
				t.Errorf("read %d events of %d, the last cut", len(got.events), n)
			}
		})
	}
}

// A journal's segments are named in order whatever the wall clock does: a
// clock stepped back (a VM restored, a correction) while the fabric is
// away named the next segment before the one it follows, within a run or
// across a restart, and the restart took up the events out of order
// (event 6 before event 1, then the agent's next number a duplicate).
func TestJournalOrderSurvivesAClockStepBack(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	n := uint64(0)
	push := func(j *journal, k int) {
		for range k {
			n++
			j.append(newOutMsg(schemas.EventSubject("a"), "n", "a", n, []byte(fmt.Sprintf(`{"n":%d}`, n)), time.Now()))
		}
		if err := j.syncNow(); err != nil {
			t.Fatal(err)
		}
	}
	kill := func(j *journal) {
		j.mu.Lock()
		j.closed = true
		j.cond.Broadcast()
		j.mu.Unlock()
		close(j.stopSync)
	}
	inOrder := func(prev previous) {
		t.Helper()
		var got []uint64
		for _, m := range prev.events {
			got = append(got, m.seq)
		}
		for i := range got {
			if got[i] != uint64(i+1) {
				t.Fatalf("the restart takes up agent a's events in the order %v", got)
			}
		}
		if len(got) != int(n) {
			t.Fatalf("the restart takes up %d of %d events", len(got), n)
		}
	}

	j, _, err := openJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	go j.run()
	push(j, 5)
	// The segment is full: the next one begins, the clock just stepped
	// back an hour.
	j.mu.Lock()
	j.now = func() time.Time { return time.Now().Add(-time.Hour) }
	if err := j.rotate(); err != nil {
		t.Fatal(err)
	}
	j.mu.Unlock()
	push(j, 5)
	kill(j)
	prev, err := readJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	inOrder(prev)

	// Across a restart: the run before named its segments an hour ahead
	// of this one's clock; this one is killed while the earlier run's
	// segments are still there (it takes them up before removing them).
	for _, name := range prev.segments {
		ahead := fmt.Sprintf("%020d-%s", segmentTime(name)+int64(2*time.Hour), name[strings.IndexByte(name, '-')+1:])
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(dir, ahead)); err != nil {
			t.Fatal(err)
		}
	}
	j, prev, err = openJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	go j.run()
	for _, m := range prev.events {
		j.append(m)
	}
	push(j, 5)
	kill(j)
	// What the first run left, and what this one wrote: the same events
	// twice, then five more, in the order they came.
	prev, err = readJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, m := range prev.events {
		got = append(got, m.seq)
	}
	want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	if !slices.Equal(got, want) {
		t.Fatalf("the restart takes up the events in the order %v, want %v", got, want)
	}
}

// The disk fills while the fabric is away (when the journal grows): a
// journal write fails part-way, and events go on without it. The node is
// then killed. Its next start names the numbers those events took as
// maybe lost, and uses them no more: it took the write's cut for a kill's
// torn write ("nothing of it was published"), and the events were gone
// without a word, their numbers used again. Nothing more is written in
// that run, room or not: the journal ends where it failed, so no record
// is missing from its middle, which the restart would not name.
func TestJournalThatCouldNotWriteSaysSo(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	j, _, err := openJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	go j.run()
	payload := strings.Repeat("x", 300)
	n := uint64(0)
	var last uint64
	push := func(k int) {
		for range k {
			n++
			last = j.append(newOutMsg(schemas.EventSubject("a"), "n", "a", n, []byte(fmt.Sprintf(`{"n":%d,"p":%q}`, n, payload)), time.Now()))
		}
	}
	tried := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if j.hasWritten(last) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the journal did not try its writes")
			}
		}
	}
	push(10)
	if err := j.syncNow(); err != nil {
		t.Fatal(err)
	}
	segs, _ := segmentNames(dir)
	fi, err := os.Stat(filepath.Join(dir, segs[0]))
	if err != nil {
		t.Fatal(err)
	}
	page := int64(os.Getpagesize())
	limit := (fi.Size()/page + 1) * page // the disk fills at the next block

	// The disk is full: no file grows past the limit (RLIMIT_FSIZE, for
	// the process: the test is not parallel).
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(limit), Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	push(40) // about 14 KB: the write is cut at the limit
	tried()
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	j.mu.Lock()
	werr := j.writeErr
	j.mu.Unlock()
	if werr == nil {
		t.Fatal("no write failed: the test did not fill the disk")
	}
	push(5) // room again
	tried()
	if err := j.syncNow(); err == nil {
		t.Error("syncNow of a journal that could not write every record: no error")
	}

	// The node is killed: the next start reads what it left.
	j.mu.Lock()
	j.closed = true
	j.cond.Broadcast()
	j.mu.Unlock()
	close(j.stopSync)
	prev, err := readJournal(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, m := range prev.events {
		got = append(got, m.seq)
	}
	t.Logf("the restart reads events %v", got)
	if !prev.failed || prev.damaged {
		t.Fatalf("a journal that could not write every record: failed %v, damaged %v; want it failed and not damaged", prev.failed, prev.damaged)
	}
	for i, seq := range got {
		if seq != uint64(i+1) || seq > 50 {
			t.Fatalf("the restart reads events %v: want those before the first failed write, and nothing after it", got)
		}
	}
	if len(got) < 10 {
		t.Fatalf("the restart reads events %v: want at least the ten written before the disk filled", got)
	}
}
