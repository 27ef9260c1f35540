package node

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/shoalfabric/shoal/schemas"
)

// numbers records, in the node's dir apart from its journal, how far each
// agent's event numbers may have gone: numbers are reserved a block at a
// time, and the file is synced before any number of a block is used. If a
// node's journal is ever lost (its files deleted, a disk replaced), the
// restarted node knows which numbers may have been used by events that
// are gone, says so on the agent's stream, and never uses them again.
type numbers struct {
	path string

	mu      sync.Mutex
	journal string            // the id of the journal these marks go with
	marks   map[string]uint64 // each agent's highest reserved number
	saving  bool              // a save is under way
	next    *numbersSave      // the save that carries what changed after the one under way began
	buf     []byte            // the file's bytes, reused by whoever saves
}

// numbersSave is one write of the file, which every change made before it
// began waits for: many agents needing a block at once share a sync.
type numbersSave struct {
	done chan struct{}
	err  error
}

// numbersBlock is how many numbers are reserved at a time, at least: an
// agent that has used many reserves a quarter as many again, so a fast
// stream syncs the file a few dozen times in its first million events,
// not once every thousand.
const numbersBlock = 1024

// maxNumbersBlock bounds a reservation, and so the range a lost journal
// can leave in doubt.
const maxNumbersBlock = 16384

type numbersFile struct {
	Journal string            `json:"journal"`
	Marks   map[string]uint64 `json:"marks"`
}

// appendJSON appends the file's JSON: a node with many agents writes it
// at every open and close, and encoding/json's reflection and sorted keys
// were most of that.
func (f numbersFile) appendJSON(b []byte) []byte {
	b = append(b, `{"journal":`...)
	b = schemas.AppendJSONString(b, f.Journal)
	b = append(b, `,"marks":{`...)
	sep := false
	for a, m := range f.Marks {
		if sep {
			b = append(b, ',')
		}
		sep = true
		b = schemas.AppendJSONString(b, a)
		b = append(b, ':')
		b = strconv.AppendUint(b, m, 10)
	}
	return append(b, "}}"...)
}

// openNumbers reads what a previous run left in path (the journal it
// went with and its marks) and starts afresh with journal, carrying the
// marks over until they are settled.
func openNumbers(path, journal string) (*numbers, numbersFile, error) {
	var prev numbersFile
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &prev); err != nil {
			return nil, prev, fmt.Errorf("the node's numbers file %s is damaged: %w", path, err)
		}
	case !os.IsNotExist(err):
		return nil, prev, fmt.Errorf("read the node's numbers file: %w", err)
	}
	n := &numbers{path: path, journal: journal, marks: map[string]uint64{}}
	for a, m := range prev.Marks {
		n.marks[a] = m
	}
	n.mu.Lock()
	if err := n.commitLocked(); err != nil {
		return nil, prev, err
	}
	return n, prev, nil
}

// reserve makes sure seq is reserved for agent, reserving the next block
// and syncing the file when it is not.
func (n *numbers) reserve(agent string, seq uint64) error {
	n.mu.Lock()
	if seq <= n.marks[agent] {
		n.mu.Unlock()
		return nil
	}
	n.marks[agent] = seq + max(numbersBlock, min(seq/4, maxNumbersBlock)) - 1
	return n.commitLocked()
}

// settle sets an agent's mark to the last number it has used, once a
// restart has accounted for what the previous run left.
func (n *numbers) settle(agent string, last uint64) error {
	n.mu.Lock()
	if last == 0 {
		delete(n.marks, agent)
	} else {
		n.marks[agent] = last
	}
	return n.commitLocked()
}

// forget drops the marks of agents none of whose events wait any more.
func (n *numbers) forget(agents ...string) error {
	n.mu.Lock()
	for _, a := range agents {
		delete(n.marks, a)
	}
	return n.commitLocked()
}

// clear drops every mark: every event is stored.
func (n *numbers) clear() error {
	n.mu.Lock()
	clear(n.marks)
	return n.commitLocked()
}

// commitLocked unlocks n.mu once the marks as they are now are in the
// file, synced. Changes that come while a save is under way share the
// next one: whoever finds no save under way writes, for itself and for
// them, until no change waits.
func (n *numbers) commitLocked() error {
	s := n.next
	if s == nil {
		s = &numbersSave{done: make(chan struct{})}
		n.next = s
	}
	if n.saving {
		n.mu.Unlock()
		<-s.done
		return s.err
	}
	n.saving = true
	for n.next != nil {
		w := n.next
		n.next = nil
		n.buf = numbersFile{Journal: n.journal, Marks: n.marks}.appendJSON(n.buf[:0])
		n.mu.Unlock()
		w.err = n.write(n.buf)
		close(w.done)
		n.mu.Lock()
	}
	n.saving = false
	n.mu.Unlock()
	return s.err
}

// write replaces the file with b, synced.
func (n *numbers) write(b []byte) error {
	tmp := n.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write the node's numbers file: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err == nil {
		err = os.Rename(tmp, n.path)
	}
	if err != nil {
		return fmt.Errorf("write the node's numbers file: %w", err)
	}
	if d, err := os.Open(filepath.Dir(n.path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
