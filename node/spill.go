package node

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// spill is the part of the outbox that waits on disk: events the node
// could not keep in memory while the fabric was away, in order.
//
// Records are gathered in memory and written in one write when they fill
// spillBuffer or are read back. A write that fails (the disk full) leaves
// them gathered and the file as it was before it, and is tried again at
// the next push or read: a full disk costs memory while it lasts, never
// a record, and the spill goes on once there is room. While a write
// fails, a read takes the records gathered in memory after those in the
// file.
type spill struct {
	path    string
	f       *os.File
	buf     []byte // records pushed and not yet in the file: they follow written
	written int64  // the file holds every record before this offset
	rpos    int64  // where the next record to read starts
	size    int64  // bytes pushed, read or not: written + len(buf)
	count   int    // records not read yet
}

// spillBuffer is what is gathered before a write.
const spillBuffer = 256 << 10

func openSpill(path string) (*spill, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("outbox spill file: %w", err)
	}
	return &spill{path: path, f: f}, nil
}

// write puts the records gathered in memory into the file after those it
// holds. A failed write leaves them gathered and cuts the file back to
// its records (a part of one would be read as damage).
func (s *spill) write() error {
	if s.rpos > s.written {
		// Read from memory while the file could not be written: those
		// need no writing.
		s.buf = s.buf[:copy(s.buf, s.buf[s.rpos-s.written:])]
		s.written = s.rpos
	}
	if len(s.buf) == 0 {
		return nil
	}
	if _, err := s.f.WriteAt(s.buf, s.written); err != nil {
		s.f.Truncate(s.written)
		return err
	}
	s.written += int64(len(s.buf))
	s.buf = s.buf[:0]
	return nil
}

// unread is how many bytes the file holds that were not read back yet.
func (s *spill) unread() int64 { return s.size - s.rpos }

// encodeSpilled appends m's agent, number, subject, headers and payload
// to b: the record of the spill and of the journal.
func encodeSpilled(b []byte, m *outMsg) []byte {
	b = appendString(b, m.agent)
	b = binary.LittleEndian.AppendUint64(b, m.seq)
	b = appendString(b, m.subject)
	if m.header != nil {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m.header)))
		for k, vs := range m.header {
			b = appendString(b, k)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(vs)))
			for _, v := range vs {
				b = appendString(b, v)
			}
		}
		return appendBytes(b, m.data)
	}
	// The headers eventMsg gives the message, written as they are, with
	// no message built to write them.
	b = binary.LittleEndian.AppendUint32(b, 3)
	b = appendString(b, schemas.HeaderMsgID)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b, at := lengthPrefixed(b)
	b = append(b, m.agent...)
	b = append(b, '.')
	b = strconv.AppendUint(b, m.seq, 10)
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	b = appendString(b, schemas.HeaderNode)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = appendString(b, m.node)
	b = appendString(b, schemas.HeaderTime)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = appendString(b, m.timeStamp())
	return appendBytes(b, m.data)
}

// lengthPrefixed appends room for a length, to be put at the offset it
// returns once what follows is appended.
func lengthPrefixed(b []byte) ([]byte, int) {
	return append(b, 0, 0, 0, 0), len(b)
}

// push appends one message, or says why it cannot: what was gathered
// could not be written, and this one would pass the gathering's bound.
func (s *spill) push(m *outMsg) error {
	if len(s.buf) >= spillBuffer {
		if err := s.write(); err != nil {
			return err
		}
	}
	at := len(s.buf)
	s.buf = append(s.buf, 0, 0, 0, 0)
	s.buf = binary.LittleEndian.AppendUint64(s.buf, m.jseq)
	s.buf = encodeSpilled(s.buf, m)
	binary.LittleEndian.PutUint32(s.buf[at:], uint32(len(s.buf)-at-4))
	s.size += int64(len(s.buf) - at)
	s.count++
	return nil
}

// pop reads back up to most messages (and at most maxBytes of them), in
// the order they were pushed; the file is emptied once all are read.
func (s *spill) pop(most, maxBytes int) ([]*outMsg, error) {
	// What a write cannot put in the file is read from memory.
	wrote := s.write() == nil
	var r io.Reader = bufio.NewReaderSize(io.NewSectionReader(s.f, s.rpos, max(0, s.written-s.rpos)), 256<<10)
	if !wrote {
		r = io.MultiReader(r, bytes.NewReader(s.buf[max(0, s.rpos-s.written):]))
	}
	var out []*outMsg
	read := 0
	for len(out) < most && read < maxBytes && s.count > 0 {
		var n [4]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return out, fmt.Errorf("outbox spill file is damaged: %w", err)
		}
		rec := make([]byte, binary.LittleEndian.Uint32(n[:]))
		if _, err := io.ReadFull(r, rec); err != nil {
			return out, fmt.Errorf("outbox spill file is damaged: %w", err)
		}
		if len(rec) < 8 {
			return out, errDamaged
		}
		m, err := decodeSpilled(rec[8:])
		if err != nil {
			return out, err
		}
		m.jseq = binary.LittleEndian.Uint64(rec)
		out = append(out, m)
		s.rpos += int64(4 + len(rec))
		s.count--
		read += len(rec)
	}
	if s.count == 0 {
		s.rpos, s.size, s.written, s.buf = 0, 0, 0, s.buf[:0]
		if err := s.f.Truncate(0); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (s *spill) close() {
	s.f.Close()
	os.Remove(s.path)
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendBytes(b, s []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

var errDamaged = errors.New("outbox spill record is damaged")

func decodeSpilled(b []byte) (*outMsg, error) {
	str := func() (string, bool) {
		if len(b) < 4 {
			return "", false
		}
		n := int(binary.LittleEndian.Uint32(b))
		if len(b) < 4+n {
			return "", false
		}
		s := string(b[4 : 4+n])
		b = b[4+n:]
		return s, true
	}
	u32 := func() (uint32, bool) {
		if len(b) < 4 {
			return 0, false
		}
		v := binary.LittleEndian.Uint32(b)
		b = b[4:]
		return v, true
	}
	agent, ok := str()
	if !ok || len(b) < 8 {
		return nil, errDamaged
	}
	seq := binary.LittleEndian.Uint64(b)
	b = b[8:]
	subject, ok := str()
	nh, ok2 := u32()
	if !ok || !ok2 {
		return nil, errDamaged
	}
	hdr := nats.Header{}
	for range nh {
		k, ok := str()
		nv, ok2 := u32()
		if !ok || !ok2 {
			return nil, errDamaged
		}
		for range nv {
			v, ok := str()
			if !ok {
				return nil, errDamaged
			}
			hdr[k] = append(hdr[k], v)
		}
	}
	data, ok := str()
	if !ok {
		return nil, errDamaged
	}
	at, _ := time.Parse(time.RFC3339Nano, hdr.Get(schemas.HeaderTime))
	return &outMsg{agent: agent, seq: seq, at: at, subject: subject, node: hdr.Get(schemas.HeaderNode), data: []byte(data), header: hdr}, nil
}
