package node

import (
	"bufio"
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
type spill struct {
	path  string
	f     *os.File
	w     *bufio.Writer
	rpos  int64 // where the next record to read starts
	size  int64 // bytes written, read or not
	count int   // records not read yet
}

func openSpill(path string) (*spill, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("outbox spill file: %w", err)
	}
	return &spill{path: path, f: f, w: bufio.NewWriterSize(f, 256<<10)}, nil
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
	b, at = lengthPrefixed(b)
	b = m.at.UTC().AppendFormat(b, time.RFC3339Nano)
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return appendBytes(b, m.data)
}

// lengthPrefixed appends room for a length, to be put at the offset it
// returns once what follows is appended.
func lengthPrefixed(b []byte) ([]byte, int) {
	return append(b, 0, 0, 0, 0), len(b)
}

// push appends one message.
func (s *spill) push(m *outMsg) error {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 128+len(m.data)), m.jseq)
	b = encodeSpilled(b, m)
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := s.w.Write(n[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	s.size += int64(4 + len(b))
	s.count++
	return nil
}

// pop reads back up to max messages (and at most maxBytes of them), in
// the order they were pushed; the file is emptied once all are read.
func (s *spill) pop(max, maxBytes int) ([]*outMsg, error) {
	if err := s.w.Flush(); err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, s.rpos, s.size-s.rpos), 256<<10)
	var out []*outMsg
	read := 0
	for len(out) < max && read < maxBytes && s.count > 0 {
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
		s.rpos, s.size = 0, 0
		if err := s.f.Truncate(0); err != nil {
			return out, err
		}
		if _, err := s.f.Seek(0, io.SeekStart); err != nil {
			return out, err
		}
		s.w.Reset(s.f)
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
