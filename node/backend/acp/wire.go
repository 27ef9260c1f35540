package acp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"

	"github.com/shoalfabric/shoal/node/proc"
)

// wire reads an agent's stdout a line at a time, in order. Session update
// notifications are handled here and go no further; a permission request
// is announced here, then handed on like every other message to the
// JSON-RPC connection, which reads what the wire writes to its pipe.
type wire struct {
	in      io.Reader
	out     *io.PipeWriter
	log     io.Writer // the agent's log, which keeps every stdout line
	maxLine int

	update     func(sessionID string, raw json.RawMessage)
	permission func(id, params json.RawMessage)
	garbage    func(line []byte, tooLong int)
}

// envelope is what the wire needs of a JSON-RPC message, read in one
// pass: a session update's session and update object.
type envelope struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		SessionID string          `json:"sessionId"`
		Update    json.RawMessage `json:"update"`
	} `json:"params"`
}

// run reads until the agent's stdout ends, then closes the pipe.
func (w *wire) run() {
	defer w.out.Close()
	r := bufio.NewReaderSize(w.in, 256<<10)
	for {
		line, tooLong, err := proc.ReadLine(r, w.maxLine)
		if len(line) > 0 || tooLong > 0 {
			w.line(line, tooLong)
		}
		if err != nil {
			return
		}
	}
}

func (w *wire) line(line []byte, tooLong int) {
	if w.log != nil {
		w.log.Write(line)
		if tooLong > 0 {
			w.log.Write([]byte("…\n"))
		}
	}
	if tooLong > 0 {
		w.garbage(line, tooLong)
		return
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	var m envelope
	if err := json.Unmarshal(line, &m); err != nil {
		// Not JSON, or params of another shape than an update's: only
		// an update needs its params read here.
		var other struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(line, &other) != nil {
			w.garbage(line, 0)
			return
		}
		m.ID, m.Method = other.ID, other.Method
		if m.Method == "session/update" {
			w.update("", nil)
			return
		}
	}
	switch {
	case m.Method == "session/update" && len(m.ID) == 0:
		w.update(m.Params.SessionID, m.Params.Update)
		return
	case m.Method == "session/request_permission" && len(m.ID) > 0:
		var p struct {
			Params json.RawMessage `json:"params"`
		}
		json.Unmarshal(line, &p)
		w.permission(m.ID, p.Params)
	}
	w.out.Write(append(line, '\n'))
}
