package web

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// flushEvery is how long an event may wait in the buffer before it is
// sent: events read in a burst (a replay catching up) share a write,
// and a live one reaches the browser this soon.
const flushEvery = 20 * time.Millisecond

// keepAlive is how often an idle stream sends a comment, so proxies and
// browsers keep it open.
const keepAlive = 15 * time.Second

// from reads where a stream starts: Last-Event-ID (a reconnecting
// EventSource) resumes after that event; else ?event=N, ?turn=T or
// ?time= (RFC 3339 or Unix seconds); else the beginning.
func from(r *http.Request) (client.From, error) {
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		n, err := strconv.ParseUint(last, 10, 64)
		if err != nil || n == math.MaxUint64 {
			// (The largest would wrap to 0, the beginning.)
			return client.From{}, schemas.Errf(schemas.CodeInvalid, "Last-Event-ID %q is not an event number", last)
		}
		return client.From{Event: n + 1}, nil
	}
	q := r.URL.Query()
	var f client.From
	if s := q.Get("event"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			return f, schemas.Errf(schemas.CodeInvalid, "event %q is not an event number (1 is the first)", s)
		}
		f.Event = n
	}
	if s := q.Get("turn"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return f, schemas.Errf(schemas.CodeInvalid, "turn %q is not a turn number (1 is the first)", s)
		}
		f.Turn = n
	}
	if s := q.Get("time"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			secs, ferr := strconv.ParseFloat(s, 64)
			// Nanoseconds since 1970 in an int64 reach 2262; past that (or
			// NaN, or infinite) the conversion wraps to any time at all.
			if ferr != nil || math.IsNaN(secs) || secs < 0 || secs >= math.MaxInt64/1e9 {
				return f, schemas.Errf(schemas.CodeInvalid, "time %q is neither RFC 3339 nor Unix seconds between 1970 and 2262", s)
			}
			t = time.Unix(0, int64(secs*1e9))
		}
		f.Time = t
	}
	if n := btoi(f.Event > 0) + btoi(f.Turn > 0) + btoi(!f.Time.IsZero()); n > 1 {
		return f, schemas.Errf(schemas.CodeInvalid, "give one of event, turn and time: a replay starts at one place")
	}
	return f, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// events streams an agent's events as Server-Sent Events: GET
// /api/agents/{id}/events. Each event's SSE id is its event number and
// its data {"n","time","kind","turn","delta","event"}, event being the
// envelope as stored; a gap is an "gap" event {"from","to"}, a message
// that is not one of the agent's events a "stray" event, and a failure a
// "failure" event {"code","message"} that ends the stream. With
// ?follow=0 the stream ends once it has caught up, with an "end" event.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := schemas.ValidID(id); err != nil {
		h.fail(w, "streaming", schemas.Errf(schemas.CodeInvalid, "agent %v", err))
		return
	}
	start, err := from(r)
	if err != nil {
		h.fail(w, "streaming", err)
		return
	}
	end, err := h.streams.begin(roleName(principalOf(r.Context())))
	if err != nil {
		w.Header().Set("Retry-After", "10")
		h.fail(w, "streaming", err)
		return
	}
	defer end()
	follow := r.URL.Query().Get("follow") != "0"
	rc := http.NewResponseController(w)
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	s := &sse{buf: bufio.NewWriterSize(w, 32<<10), flush: rc.Flush}
	s.buf.WriteString("retry: 1000\n\n")
	s.send()
	stop := make(chan struct{})
	var ticking sync.WaitGroup
	ticking.Go(func() { s.tick(stop) })
	defer func() {
		close(stop)
		ticking.Wait()
		s.send()
	}()

	err = h.cfg.Client.Replay(r.Context(), []string{id}, start, follow, func(ev client.Replayed, gap *client.Gap) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if gap != nil {
			s.write("gap", "", []byte(`{"from":`+strconv.FormatUint(gap.From, 10)+`,"to":`+strconv.FormatUint(gap.To, 10)+`}`))
		}
		if ev.Stray != "" {
			reason, _ := json.Marshal(map[string]string{"reason": ev.Stray})
			s.write("stray", "", reason)
			return nil
		}
		s.write("", strconv.FormatUint(ev.N, 10), eventData(ev))
		return s.err
	})
	if r.Context().Err() != nil {
		return // the browser went away
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gap, ok := errors.AsType[client.Gap](err); ok {
		// Nothing of the agent is stored from there on: a gap, as any
		// other hole is said, and the end of what is stored.
		s.write("gap", "", []byte(`{"from":`+strconv.FormatUint(gap.From, 10)+`,"to":`+strconv.FormatUint(gap.To, 10)+`}`))
		err = nil
	}
	if err != nil {
		ce, ok := err.(*schemas.ControlError)
		if !ok {
			ce = &schemas.ControlError{Code: schemas.CodeOf(err), Message: err.Error()}
		}
		data, _ := json.Marshal(ce)
		s.write("failure", "", data)
		return
	}
	s.write("end", "", []byte("{}"))
}

// StreamsPerRole bounds the event streams the dashboard serves one role
// (the full token, the observer token) at once. Each holds a reader of
// the agents' stream, a JetStream consumer, of which the stream has at
// most 1,000 for everyone: the observer's token once held them all, and
// every read of the fabric (a person's page, agent_output, shoal tail)
// failed. A page follows one agent.
const StreamsPerRole = 64

// streams counts the event streams being served, by role.
type streams struct {
	mu   sync.Mutex
	open map[string]int
}

// begin counts a stream of role's, or says why it may not begin now; end
// is called once it is over.
func (s *streams) begin(role string) (end func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.open[role]; n >= StreamsPerRole {
		return nil, schemas.Errf(schemas.CodeUnavailable, "%d event streams are open under these credentials, the most the dashboard serves them at once: close a page, or wait for one to end", n)
	}
	s.open[role]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.open[role]--
	}, nil
}

// eventData is one event's SSE data, built without decoding the envelope.
func eventData(ev client.Replayed) []byte {
	raw := ev.Raw
	if bytes.IndexByte(raw, '\n') >= 0 || bytes.IndexByte(raw, '\r') >= 0 || !json.Valid(raw) {
		var c bytes.Buffer
		if json.Compact(&c, raw) == nil {
			raw = c.Bytes()
		} else {
			raw, _ = json.Marshal(string(ev.Raw)) // keep what cannot be read, as a string
		}
	}
	b := make([]byte, 0, len(raw)+96)
	b = append(b, `{"n":`...)
	b = strconv.AppendUint(b, ev.N, 10)
	b = append(b, `,"time":`...)
	b = strconv.AppendFloat(b, float64(ev.Time.UnixMilli())/1e3, 'f', 3, 64)
	b = append(b, `,"kind":`...)
	b = strconv.AppendQuote(b, string(ev.Kind))
	b = append(b, `,"turn":`...)
	b = strconv.AppendInt(b, int64(ev.Turn), 10)
	b = append(b, `,"delta":`...)
	b = strconv.AppendBool(b, ev.Delta)
	b = append(b, `,"event":`...)
	b = append(b, raw...)
	return append(b, '}')
}

// sse writes one stream's messages into a buffer that tick sends.
type sse struct {
	mu    sync.Mutex
	buf   *bufio.Writer
	flush func() error
	dirty bool
	err   error
	idle  time.Duration
}

// write buffers one message; the caller holds mu.
func (s *sse) write(event, id string, data []byte) {
	if event != "" {
		s.buf.WriteString("event: ")
		s.buf.WriteString(event)
		s.buf.WriteByte('\n')
	}
	if id != "" {
		s.buf.WriteString("id: ")
		s.buf.WriteString(id)
		s.buf.WriteByte('\n')
	}
	s.buf.WriteString("data: ")
	s.buf.Write(data)
	s.buf.WriteString("\n\n")
	s.dirty = true
}

// send writes out what is buffered; the caller holds mu, or is the only
// writer left.
func (s *sse) send() {
	if err := s.buf.Flush(); err != nil && s.err == nil {
		s.err = err
	}
	if err := s.flush(); err != nil && s.err == nil {
		s.err = err
	}
	s.dirty = false
}

func (s *sse) tick(stop <-chan struct{}) {
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		switch {
		case s.dirty:
			s.send()
			s.idle = 0
		case s.idle >= keepAlive:
			s.buf.WriteString(": keep-alive\n\n")
			s.send()
			s.idle = 0
		default:
			s.idle += flushEvery
		}
		s.mu.Unlock()
	}
}
