package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// pidFile is pids.json: the agent processes this node runs, so that a node
// restarted after a crash reaps what the crash left behind. Each entry
// records the process's start time as well as its pid, so a recycled pid
// is never mistaken for an agent.
type pidFile struct {
	path string
	mu   sync.Mutex
	m    map[string]pidEntry // what the file holds; nil until first read
	buf  []byte              // the file's bytes, reused
}

type pidEntry struct {
	PID   int    `json:"pid,omitempty"`
	Start string `json:"start,omitempty"`
	// Life is the token every process of the agent's life carries
	// (proc.LifeEnv).
	Life string `json:"life,omitempty"`
}

// load is what the file holds, read from disk the first time: only this
// node writes it (the store's lock holds any other off). f.mu is held.
func (f *pidFile) load() map[string]pidEntry {
	if f.m == nil {
		f.m = map[string]pidEntry{}
		if b, err := os.ReadFile(f.path); err == nil {
			json.Unmarshal(b, &f.m)
		}
	}
	return f.m
}

// save writes m, which load returned, to the file. f.mu is held.
func (f *pidFile) save(m map[string]pidEntry) error {
	f.m = m
	f.buf = appendPids(f.buf[:0], m)
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, f.buf, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, f.path)
}

// appendPids appends m as JSON, as encoding/json writes it but for the
// order of the keys: the file is written at every open and close, and
// encoding/json's reflection and sorted keys were most of that with many
// agents.
func appendPids(b []byte, m map[string]pidEntry) []byte {
	b = append(b, '{')
	sep := false
	for agent, e := range m {
		if sep {
			b = append(b, ',')
		}
		sep = true
		b = schemas.AppendJSONString(b, agent)
		b = append(b, ":{"...)
		inner := false
		field := func(name string) {
			if inner {
				b = append(b, ',')
			}
			inner = true
			b = append(b, name...)
		}
		if e.PID != 0 {
			field(`"pid":`)
			b = strconv.AppendInt(b, int64(e.PID), 10)
		}
		if e.Start != "" {
			field(`"start":`)
			b = schemas.AppendJSONString(b, e.Start)
		}
		if e.Life != "" {
			field(`"life":`)
			b = schemas.AppendJSONString(b, e.Life)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// add records an agent's process (pid 0 when it has none) and its life's
// token.
func (f *pidFile) add(agent string, pid int, life string) error {
	e := pidEntry{PID: pid, Life: life}
	if pid > 0 {
		start, err := proc.StartTime(pid)
		if err != nil {
			return err
		}
		e.Start = start
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.load()
	m[agent] = e
	return f.save(m)
}

// remove forgets an agent's process, and returns its life's token.
func (f *pidFile) remove(agent string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.load()
	e, ok := m[agent]
	if ok {
		delete(m, agent)
		f.save(m)
	}
	return e.Life
}

type reaped struct {
	agent, how string
	pid        int
}

// reap kills, for every listed agent, every process that carries the
// agent's life token, and the process group of a leader that is still
// running with the start time it was recorded with (a pid and its start
// time name one process; a recycled pid has another start), then empties
// the file. A group whose leader is gone is not killed whole: its number
// may have been handed to a stranger who made a group of it, and nothing
// proves its members are the agent's but the token, which has already
// found them; the ones without it are left alone and said so.
func (f *pidFile) reap() []reaped {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []reaped
	for id, e := range f.load() {
		if n := proc.ReapLife(e.Life); n > 0 {
			out = append(out, reaped{id, fmt.Sprintf("killed %d processes of its life", n), e.PID})
		}
		if e.PID <= 1 {
			continue
		}
		start, err := proc.StartTime(e.PID)
		switch {
		case err == nil && start == e.Start:
			if proc.KillGroup(e.PID) == nil {
				out = append(out, reaped{id, "killed its process group", e.PID})
			}
		case groupExists(e.PID):
			out = append(out, reaped{id, "left process group " + strconv.Itoa(e.PID) + " alone: its leader is gone or another process, and nothing in it carries the agent's token", e.PID})
		}
	}
	f.save(map[string]pidEntry{})
	return out
}

// groupExists reports whether any process is in group pgid.
func groupExists(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
