package node

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// journal is the outbox on disk: every event the node numbers is written
// to it before it is published, so a node killed while the fabric is away
// publishes it again after its restart, under the same Nats-Msg-Id.
//
// Records are appended in the order events are numbered, each with a
// journal sequence (jseq) and a checksum, to segment files in a
// directory; a segment is removed once the stream has acknowledged every
// event in it. Writes are grouped: whatever was appended while the last
// write ran is written with the next one, so the write does not slow the
// node down, and the publisher sends only what has been written. A write
// reaches the kernel, which keeps it if the node's process is killed; the
// journal is synced to the disk every SyncInterval, which bounds what a
// power loss takes.
type journal struct {
	dir  string
	id   string // names this journal, so one that vanished is told from one that is empty
	sync time.Duration
	log  *slog.Logger

	mu      sync.Mutex
	cond    *sync.Cond // signalled when there is something to write
	taken   *sync.Cond // broadcast when the writer takes the buffer
	buf     []byte     // appended, not yet written
	spare   []byte     // the buffer last written, for appends to reuse
	bufLast uint64     // the jseq of the last record in buf
	next    uint64     // the jseq the next record gets
	written uint64     // every record up to this jseq is written
	// sendable is written, read without j.mu by the publisher before
	// each event it sends; every jseq once a write has failed.
	sendable  atomic.Uint64
	dirty     bool // written since the last sync
	seg       *os.File
	segFirst  uint64 // the first jseq in seg
	segSize   int64
	named     int64            // the number the newest segment in the dir is named by
	now       func() time.Time // names segments (tests set it back)
	sealed    []segment        // older segments, oldest first
	retired   uint64           // every record up to this jseq is acknowledged
	closed    bool
	writeErr  error
	wroteOnce chan struct{} // closed and replaced after each write
	onWrite   func()        // called after each write, without j.mu
	stopSync  chan struct{} // closed to stop the syncer
	synced    chan struct{} // closed when the syncer has stopped
}

// segment is a closed segment file and the last jseq it holds.
type segment struct {
	path string
	last uint64
}

// journalSegmentSize is the size at which a segment is closed and the
// next one begun.
const journalSegmentSize = 64 << 20

// journalBuffer bounds what is appended but not yet written.
const journalBuffer = 64 << 10

// journalSyncInterval is how often written records are synced to the
// disk: what a power loss can take.
const journalSyncInterval = 200 * time.Millisecond

// openJournal opens the journal in dir: what a previous run left in it
// is returned (in order, cut at the first damaged record), and a fresh
// journal begins with its own segments and id.
func openJournal(dir string, log *slog.Logger) (*journal, previous, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, previous{}, fmt.Errorf("journal dir: %w", err)
	}
	old, err := readJournal(dir, log)
	if err != nil {
		return nil, previous{}, err
	}
	var idb [8]byte
	rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	// The boot this journal's segments are written in, for a later run's
	// reading of them.
	if err := os.WriteFile(bootFile(dir, id), []byte(currentBoot()), 0o600); err != nil {
		return nil, previous{}, fmt.Errorf("journal: %w", err)
	}
	j := &journal{dir: dir, id: id, sync: journalSyncInterval, log: log, next: 1, now: time.Now, wroteOnce: make(chan struct{}),
		stopSync: make(chan struct{}), synced: make(chan struct{})}
	for _, name := range old.segments {
		j.named = max(j.named, segmentTime(name))
	}
	j.cond = sync.NewCond(&j.mu)
	j.taken = sync.NewCond(&j.mu)
	if err := j.rotate(); err != nil {
		return nil, previous{}, err
	}
	return j, old, nil
}

// previous is what a previous run left in a journal dir: its events, in
// order, the segments that held them, and the ids of the journals they
// belonged to.
type previous struct {
	events   []*outMsg
	segments []string
	ids      map[string]bool
	// damaged says a segment held a damaged record: what followed it is
	// not read, and its numbers may have been used.
	damaged bool
	// failed says a journal could not write every record (its boot file
	// says journalFailed): their numbers may have been used.
	failed bool
}

// readJournal reads every segment a previous run left, in order, and
// removes none of them: the caller removes them (removeOld) once their
// events are in the new journal.
func readJournal(dir string, log *slog.Logger) (previous, error) {
	names, err := segmentNames(dir)
	if err != nil {
		return previous{}, err
	}
	prev := previous{segments: names, ids: map[string]bool{}}
	// A write cut short by a kill is told from damage only within the
	// boot the journal's segments were written in: after a power loss or
	// a crash of the machine, a cut at a page boundary is what the disk
	// kept. And only in a journal's last segment: the others were synced
	// and closed when the next began.
	boot := currentBoot()
	last, sameBoot := map[string]string{}, map[string]bool{}
	for _, name := range names {
		id := segmentJournal(name)
		last[id] = name
		written, _ := os.ReadFile(bootFile(dir, id))
		sameBoot[id] = len(written) > 0 && string(written) == boot
		if string(written) == journalFailed && !prev.failed {
			log.Warn("the journal could not write every record its run appended; the numbers they took may have been used", "journal", id)
			prev.failed = true
		}
	}
	// The boots of journals none of whose segments are left go.
	if stale, err := filepath.Glob(filepath.Join(dir, "*.boot")); err == nil {
		for _, f := range stale {
			if _, ok := last[strings.TrimSuffix(filepath.Base(f), ".boot")]; !ok {
				os.Remove(f)
			}
		}
	}
	var out []*outMsg
	for _, name := range names {
		prev.ids[segmentJournal(name)] = true
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return previous{}, fmt.Errorf("read the journal: %w", err)
		}
		r := bufio.NewReaderSize(f, 256<<10)
		for {
			m, err := readRecord(r)
			if err == io.EOF {
				break
			}
			if err != nil {
				// A run killed while writing leaves half a record at the
				// end; nothing after it is whole.
				if id := segmentJournal(name); sameBoot[id] && last[id] == name && tornByAKill(f, err) {
					log.Info("the journal's last write was cut short by the node's end; what it held was never published", "segment", name)
					break
				}
				log.Warn("the journal ends with a damaged record; what follows it is not read", "segment", name, "err", err)
				prev.damaged = true
				break
			}
			out = append(out, m)
		}
		f.Close()
	}
	prev.events = out
	return prev, nil
}

// segmentTime is the number a segment is named by, 0 for a name without
// one.
func segmentTime(name string) int64 {
	n, _ := strconv.ParseInt(name[:max(0, strings.IndexByte(name, '-'))], 10, 64)
	return n
}

// segmentJournal is the id of the journal a segment belongs to.
func segmentJournal(name string) string {
	return strings.TrimSuffix(name[strings.LastIndexByte(name, '-')+1:], ".seg")
}

// segmentNames lists a journal dir's segments in order.
func segmentNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the journal: %w", err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".seg") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names) // names are zero-padded: time order
	return names, nil
}

// removeOld removes the segments a previous run left, once the fresh
// journal has their events and has synced them.
func (j *journal) removeOld(names []string) {
	for _, name := range names {
		if err := os.Remove(filepath.Join(j.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			j.log.Warn("cannot remove a replayed journal segment", "segment", name, "err", err)
		}
	}
}

// rotate closes the open segment and begins a new one; j.mu is held or
// the journal is not shared yet.
func (j *journal) rotate() error {
	if j.seg != nil {
		if err := j.seg.Sync(); err != nil {
			return err
		}
		j.seg.Close()
		j.sealed = append(j.sealed, segment{path: j.seg.Name(), last: j.next - 1})
	}
	// Named in order after every segment in the dir, whatever the clock
	// says: a clock stepped back (a VM restored, a correction) would
	// otherwise sort a later segment first, and a restart take up its
	// events before the earlier ones.
	j.named = max(j.now().UnixNano(), j.named+1)
	name := fmt.Sprintf("%020d-%s.seg", j.named, j.id)
	f, err := os.OpenFile(filepath.Join(j.dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("open a journal segment: %w", err)
	}
	j.seg, j.segFirst, j.segSize = f, j.next, 0
	j.trim()
	return nil
}

// append adds an event's record and returns its jseq. It never waits for
// the disk.
func (j *journal) append(m *outMsg) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	// What waits to be written is bounded, which bounds what a kill can
	// take: past it, appending waits for the writer to take the buffer
	// (not for the write itself).
	for len(j.buf) >= journalBuffer && !j.closed && j.writeErr == nil {
		j.taken.Wait()
	}
	jseq := j.next
	j.next++
	j.buf = appendRecord(j.buf, jseq, m)
	j.bufLast = jseq
	j.cond.Signal()
	return jseq
}

// run writes appended records until closed, and syncs the journal every
// j.sync.
func (j *journal) run() {
	go j.syncer()
	j.mu.Lock()
	defer j.mu.Unlock()
	for {
		for len(j.buf) == 0 && !j.closed {
			j.cond.Wait()
		}
		if len(j.buf) == 0 && j.closed {
			return
		}
		buf, last := j.buf, j.bufLast
		j.buf, j.spare = j.spare[:0], nil
		j.taken.Broadcast()
		seg, size, off := j.seg, j.segSize, j.writeErr != nil
		j.mu.Unlock()
		// Once a write has failed, nothing more is written in this run:
		// the journal ends where it failed, so what a restart names as
		// maybe lost (after the last event it holds) covers every record
		// it lacks, none in the middle.
		var err error
		if !off {
			var n int
			if n, err = seg.Write(buf); err != nil {
				j.failed(seg, size, n)
			}
		}
		j.mu.Lock()
		if err != nil && j.writeErr == nil {
			j.writeErr = err
			j.log.Error("cannot write the journal (is the disk full?); events are published without it until the node restarts, which names the numbers they may have taken", "err", err)
		}
		j.written, j.dirty = last, !off && err == nil
		if j.writeErr != nil {
			j.sendable.Store(math.MaxUint64)
		} else {
			j.sendable.Store(last)
		}
		if !off && err == nil {
			j.segSize += int64(len(buf))
		}
		if cap(buf) <= 4*journalBuffer {
			j.spare = buf // the next write's buffer: appends do not grow one afresh
		}
		close(j.wroteOnce)
		j.wroteOnce = make(chan struct{})
		if j.segSize >= journalSegmentSize {
			if err := j.rotate(); err != nil {
				j.log.Error("cannot begin a journal segment", "err", err)
			}
		}
		if f := j.onWrite; f != nil {
			j.mu.Unlock()
			f()
			j.mu.Lock()
		}
	}
}

// failed takes a write that failed (n bytes of it written) at size into
// seg: what it wrote of it is cut off, so the segment ends with a whole
// record, and the journal's boot file says "failed", which tells a later
// run that records are missing from it (readJournal): their events went
// on without it, and a kill before they were stored would otherwise lose
// them without a word, their numbers used again. Neither needs room on
// the disk.
func (j *journal) failed(seg *os.File, size int64, n int) {
	if n > 0 {
		if terr := seg.Truncate(size); terr != nil {
			j.log.Error("cannot cut a failed write off the journal", "err", terr)
		}
	}
	if _, serr := seg.Seek(size, io.SeekStart); serr != nil {
		j.log.Error("cannot cut a failed write off the journal", "err", serr)
	}
	// Written over the boot id it holds, in place: no room is needed.
	f, err := os.OpenFile(bootFile(j.dir, j.id), os.O_WRONLY, 0)
	if err == nil {
		if _, err = f.WriteAt([]byte(journalFailed), 0); err == nil {
			err = f.Truncate(int64(len(journalFailed)))
		}
		f.Close()
	}
	if err != nil {
		j.log.Error("cannot mark the journal as missing records", "err", err)
	}
}

// journalFailed is what a journal's boot file holds once a write of it
// failed.
const journalFailed = "failed"

// syncer syncs written records to the disk every j.sync.
func (j *journal) syncer() {
	defer close(j.synced)
	t := time.NewTicker(j.sync)
	defer t.Stop()
	for {
		select {
		case <-j.stopSync:
			return
		case <-t.C:
		}
		j.mu.Lock()
		dirty, seg := j.dirty, j.seg
		j.dirty = false
		j.mu.Unlock()
		if dirty {
			seg.Sync()
		}
	}
}

// hasWritten reports whether the record jseq is written (or the journal
// cannot write, when events go on without it).
func (j *journal) hasWritten(jseq uint64) bool {
	return jseq <= j.sendable.Load()
}

// syncNow writes and syncs everything appended so far.
func (j *journal) syncNow() error {
	j.mu.Lock()
	target := j.next - 1
	for j.written < target && j.writeErr == nil {
		ch := j.wroteOnce
		j.mu.Unlock()
		<-ch
		j.mu.Lock()
	}
	seg, err := j.seg, j.writeErr
	j.mu.Unlock()
	if err != nil {
		return err
	}
	return seg.Sync()
}

// retire notes that every record up to jseq is acknowledged, and removes
// the segments that hold nothing else.
func (j *journal) retire(jseq uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if jseq > j.retired {
		j.retired = jseq
		j.trim()
	}
}

// trim removes sealed segments whose records are all retired; j.mu is
// held.
func (j *journal) trim() {
	for len(j.sealed) > 0 && j.sealed[0].last <= j.retired {
		if err := os.Remove(j.sealed[0].path); err != nil && !errors.Is(err, os.ErrNotExist) {
			j.log.Warn("cannot remove a journal segment", "segment", j.sealed[0].path, "err", err)
		}
		j.sealed = j.sealed[1:]
	}
}

// close writes what is left and closes the journal. With everything
// retired (a clean stop), its files are removed.
func (j *journal) close() {
	j.mu.Lock()
	j.closed = true
	j.cond.Broadcast()
	j.taken.Broadcast()
	j.mu.Unlock()
	j.syncNow()
	close(j.stopSync)
	<-j.synced
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seg.Close()
	if j.retired >= j.next-1 {
		j.sealed = append(j.sealed, segment{path: j.seg.Name(), last: j.next - 1})
		j.trim()
	}
}

// A record: length (4 bytes, of what follows the checksum), CRC-32C of
// it (4), jseq (8), then the event as spill encodes it.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

func appendRecord(b []byte, jseq uint64, m *outMsg) []byte {
	head := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, jseq)
	b = encodeSpilled(b, m)
	body := b[head+8:]
	binary.LittleEndian.PutUint32(b[head:], uint32(len(body)))
	binary.LittleEndian.PutUint32(b[head+4:], crc32.Checksum(body, crcTable))
	return b
}

func readRecord(r *bufio.Reader) (*outMsg, error) {
	m, _, err := readRecordSeq(r)
	return m, err
}

// bootFile, in a journal's directory, holds the boot journal id's
// segments are written in (currentBoot).
func bootFile(dir, id string) string { return filepath.Join(dir, id+".boot") }

// currentBoot is the kernel's id of this boot, "" where there is none.
func currentBoot() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// errCutShort is a record the file ends inside of.
var errCutShort = errors.New("a record cut short")

// tornByAKill says whether a segment whose reading failed with err (f,
// read to its end) ends as a write cut short by the kill of the process
// writing it does: inside its last record, at a page boundary. The
// kernel copies a write into the file a page at a time and stops, for a
// fatal signal, only between pages, so such a write ends at a page
// boundary; what it held was never published (the publisher sends only
// what is written), and its numbers were seen by no one: the documented
// window, not damage. A segment cut short anywhere else (a person's
// truncate), or in another boot (a power loss: readJournal asks), is
// damage: what was past the cut may have been published.
func tornByAKill(f *os.File, err error) bool {
	if !errors.Is(err, errCutShort) {
		return false
	}
	fi, serr := f.Stat()
	return serr == nil && fi.Size() > 0 && fi.Size()%int64(os.Getpagesize()) == 0
}

func readRecordSeq(r *bufio.Reader) (*outMsg, uint64, error) {
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, 0, errCutShort
		}
		return nil, 0, err
	}
	n := binary.LittleEndian.Uint32(head[:4])
	if n < 8 || n > 256<<20 {
		return nil, 0, fmt.Errorf("a record of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, 0, errCutShort
	}
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(head[4:]) {
		return nil, 0, errors.New("a record whose checksum is wrong")
	}
	m, err := decodeSpilled(body[8:])
	return m, binary.LittleEndian.Uint64(body), err
}
