package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/server"
)

// ServeStdio serves MCP on in and out (newline-delimited JSON-RPC) until
// ctx ends or in closes. A request read before in closes is answered
// first: a client that writes its calls and closes its end (a script's
// pipe) gets every answer, where the stdio server would cancel the calls
// still running as its input ends.
func (m *MCP) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	calls := &inFlight{ctx: ctx, open: map[string]int{}}
	calls.cond = sync.NewCond(&calls.mu)
	stop := context.AfterFunc(ctx, func() {
		calls.mu.Lock()
		defer calls.mu.Unlock()
		calls.cond.Broadcast()
	})
	defer stop()
	return server.NewStdioServer(m.srv).Listen(ctx, &drainingReader{r: in, calls: calls}, &answerWriter{w: out, calls: calls})
}

// inFlight counts the requests read and not yet answered, by id.
type inFlight struct {
	ctx  context.Context
	mu   sync.Mutex
	cond *sync.Cond
	open map[string]int
}

// message is what inFlight reads of a JSON-RPC line.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// key is how an id is counted: a string or a number, as the server
// writes it back; "" for what the server could not answer by its id.
func (m message) key() string {
	var v any
	if json.Unmarshal(m.ID, &v) != nil {
		return ""
	}
	switch v := v.(type) {
	case string:
		return "s" + v
	case float64:
		return "n" + strconv.FormatFloat(v, 'g', -1, 64)
	}
	return ""
}

// lines calls each for every whole line in *buf, keeping the rest.
func lines(buf *[]byte, each func(line []byte)) {
	for {
		i := bytes.IndexByte(*buf, '\n')
		if i < 0 {
			return
		}
		each((*buf)[:i])
		*buf = (*buf)[i+1:]
	}
}

// drainingReader reads the client's lines; at their end it waits for
// every request read to be answered before it says so.
type drainingReader struct {
	r     io.Reader
	calls *inFlight
	buf   []byte
}

func (d *drainingReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.buf = append(d.buf, p[:n]...)
	c := d.calls
	lines(&d.buf, func(line []byte) {
		var m message
		if json.Unmarshal(line, &m) == nil && m.Method != "" && m.key() != "" {
			c.mu.Lock()
			c.open[m.key()]++
			c.mu.Unlock()
		}
	})
	if err == io.EOF {
		c.mu.Lock()
		for len(c.open) > 0 && c.ctx.Err() == nil {
			c.cond.Wait()
		}
		c.mu.Unlock()
	}
	return n, err
}

// answerWriter writes the server's lines, and counts its answers.
type answerWriter struct {
	w     io.Writer
	calls *inFlight
	mu    sync.Mutex
	buf   []byte
}

func (a *answerWriter) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, err := a.w.Write(p)
	a.buf = append(a.buf, p[:n]...)
	c := a.calls
	lines(&a.buf, func(line []byte) {
		var m message
		if json.Unmarshal(line, &m) != nil || m.key() == "" || (m.Result == nil && m.Error == nil) {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.open[m.key()]--; c.open[m.key()] <= 0 {
			delete(c.open, m.key())
		}
		c.cond.Broadcast()
	})
	return n, err
}
