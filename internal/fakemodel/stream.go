package fakemodel

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// stream writes the frames of one streaming reply, pacing them by
// Reply.Delay and stopping at the first content frame when Reply.Hang is
// set. Every method reports false once the reply must stop: the client went
// away, the Server is closing, or the reply hangs.
type stream struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	ctx    context.Context // the request's; done when the client goes away
	closed <-chan struct{} // the Server's
	delay  time.Duration
	hang   bool
	frames int
}

func (s *Server) newStream(w http.ResponseWriter, r *http.Request, reply Reply) *stream {
	return &stream{
		w:      w,
		rc:     http.NewResponseController(w),
		ctx:    r.Context(),
		closed: s.closed,
		delay:  reply.Delay,
		hang:   reply.Hang,
	}
}

// open sends the 200 status and headers, with any set on st.w.Header()
// beforehand.
func (st *stream) open(contentType string) bool {
	h := st.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-cache")
	st.w.WriteHeader(http.StatusOK)
	return st.rc.Flush() == nil
}

// send writes and flushes one frame, after Reply.Delay unless it is the
// first.
func (st *stream) send(frame []byte) bool {
	if st.frames > 0 && st.delay > 0 && !st.wait(st.delay) {
		return false
	}
	st.frames++
	if _, err := st.w.Write(frame); err != nil {
		return false
	}
	return st.rc.Flush() == nil
}

// content sends a frame that carries part of the reply's content. With
// Reply.Hang, the first such frame is the last frame sent.
func (st *stream) content(frame []byte) bool {
	return st.send(frame) && st.hangPoint()
}

// hangPoint hangs if Reply.Hang is set. Dialects call it before ending a
// stream, so that a reply without content hangs too.
func (st *stream) hangPoint() bool {
	if !st.hang {
		return true
	}
	st.wait(-1)
	return false
}

// wait pauses for d (forever if d < 0) unless the client goes away or the
// Server closes first, which it reports as false.
func (st *stream) wait(d time.Duration) bool {
	var timeout <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
		return true
	case <-st.ctx.Done():
	case <-st.closed:
	}
	return false
}

// sseData frames v as a server-sent event with only a data field, as the
// OpenAI endpoints send them.
func sseData(v any) []byte {
	return append(append([]byte("data: "), encodeJSON(v)...), "\n\n"...)
}

// sseEvent frames v as a named server-sent event, as Anthropic sends them.
func sseEvent(name string, v any) []byte {
	b := append([]byte("event: "+name+"\ndata: "), encodeJSON(v)...)
	return append(b, "\n\n"...)
}

// sseDone is the OpenAI end-of-stream marker.
const sseDone = "data: [DONE]\n\n"

// encodeJSON marshals v on one line without escaping <, > and &, as the
// real servers do. The values are the package's own wire types, whose raw
// JSON parts were validated by newPlan, so it cannot fail.
func encodeJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("fakemodel: encoding a reply: " + err.Error())
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// writeJSON answers with status and v as the whole JSON body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body := encodeJSON(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
