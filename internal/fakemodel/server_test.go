package fakemodel_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

func TestURLIsLoopback(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") || strings.HasSuffix(s.URL(), "/") {
		t.Errorf("URL() = %q", s.URL())
	}
}

// TestScriptIsOneFIFOAcrossDialects checks that each model request takes
// the next reply, whichever dialect it speaks, and that every dialect
// decodes the scripted content.
func TestScriptIsOneFIFOAcrossDialects(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	for _, dc := range dialectCases {
		if dc.cfg.MLX {
			continue // the same endpoint as openai; covered by its own server below
		}
		s.Script(fakemodel.Reply{
			Thinking:  "thinking for " + dc.name,
			Text:      "reply for " + dc.name,
			ToolCalls: []fakemodel.ToolCall{{Name: "tool_" + dc.name, Input: []byte(`{"n":1}`)}},
		})
	}
	ctx := testContext(t)
	var want []fakemodel.Dialect
	for _, dc := range dialectCases {
		if dc.cfg.MLX {
			continue
		}
		d := dc.decode(t, dc.send(t, ctx, s, "question for "+dc.name, true).Body)
		if d.Thinking != "thinking for "+dc.name || d.Text != "reply for "+dc.name || !d.Done || d.Error != "" {
			t.Errorf("%s: decoded %+v", dc.name, d)
		}
		if len(d.Calls) != 1 || d.Calls[0].Name != "tool_"+dc.name || d.Calls[0].Args != `{"n":1}` {
			t.Errorf("%s: calls %+v", dc.name, d.Calls)
		}
		want = append(want, fakemodel.Dialect(dc.name))
	}
	reqs := s.Requests()
	if len(reqs) != len(want) || s.Pending() != 0 {
		t.Fatalf("%d requests, %d pending", len(reqs), s.Pending())
	}
	for i, r := range reqs {
		if r.Dialect != want[i] || r.UserText != "question for "+string(want[i]) {
			t.Errorf("request %d: %s %q", i, r.Dialect, r.UserText)
		}
	}
}

func TestEveryDialectStreamsAndAnswersWhole(t *testing.T) {
	t.Parallel()
	for _, dc := range dialectCases {
		t.Run(dc.name, func(t *testing.T) {
			t.Parallel()
			s := fakemodel.Start(t, dc.cfg)
			s.Script(fakemodel.Reply{Text: "streamed, ok", ChunkSize: 3}, fakemodel.Reply{Text: "whole"})
			ctx := testContext(t)
			if d := dc.decode(t, dc.send(t, ctx, s, "hi", true).Body); d.Text != "streamed, ok" || !d.Done || d.Output != 2 {
				t.Errorf("streamed: %+v", d)
			}
			resp := dc.send(t, ctx, s, "hi", false)
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"whole"`) ||
				!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Errorf("whole: %d %q %s (%v)", resp.StatusCode, resp.Header.Get("Content-Type"), body, err)
			}
		})
	}
}

func TestDefaultReply(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := fakemodel.Start(t, fakemodel.Config{})
	if d := decodeAnthropic(t, post(t, ctx, s.URL()+"/v1/messages", anthropicBody("hi", true)).Body); d.Text != "ok" {
		t.Errorf("empty script answered %q, want ok", d.Text)
	}

	echo := fakemodel.Start(t, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		return fakemodel.Reply{Text: "you said: " + r.UserText}
	}})
	echo.Script(fakemodel.Reply{Text: "scripted"})
	for _, want := range []string{"scripted", "you said: second"} {
		if d := decodeOllama(t, post(t, ctx, echo.URL()+"/api/chat", ollamaBody("second", true)).Body); d.Text != want {
			t.Errorf("answered %q, want %q", d.Text, want)
		}
	}
}

func TestUnknownPathsAreNotModelRequests(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{Text: "kept"})
	ctx := testContext(t)
	// Claude Code's preconnect.
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, s.URL()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("HEAD / = %d", resp.StatusCode)
	}
	if r := get(t, ctx, s.URL()+"/v1/messages"); r.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/messages = %d", r.StatusCode)
	}
	if r := post(t, ctx, s.URL()+"/v1/messages/count_tokens", `{}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("count_tokens = %d", r.StatusCode)
	}
	if len(s.Requests()) != 0 || s.Pending() != 1 {
		t.Errorf("%d recorded, %d pending", len(s.Requests()), s.Pending())
	}
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	for _, dc := range dialectCases {
		t.Run(dc.name, func(t *testing.T) {
			t.Parallel()
			s := fakemodel.Start(t, dc.cfg)
			s.Script(fakemodel.Reply{Text: "kept"})
			ctx := testContext(t)
			url := map[string]string{
				"anthropic": s.URL() + "/v1/messages",
				"openai":    s.URL() + "/v1/chat/completions",
				"mlx":       s.URL() + "/v1/chat/completions",
				"gemini":    geminiURL(s, "g", true),
				"ollama":    s.URL() + "/api/chat",
			}[dc.name]
			for _, body := range []string{
				`{"messages": [`, // not JSON
				`{"messages": [{"role": "user", "content": 42}], "contents": 7}`, // wrong types
			} {
				resp := post(t, ctx, url, body)
				msg, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(msg), "malformed") {
					t.Errorf("%s: %d %s", body, resp.StatusCode, msg)
				}
			}
			if len(s.Requests()) != 0 || s.Pending() != 1 {
				t.Errorf("%d recorded, %d pending", len(s.Requests()), s.Pending())
			}
		})
	}
}

func TestInvalidScriptedToolInput(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: []byte(`"not an object"`)}}})
	resp := post(t, testContext(t), s.URL()+"/v1/messages", anthropicBody("hi", true))
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(msg), "Bash") {
		t.Errorf("%d %s", resp.StatusCode, msg)
	}
}

func TestWaitRequests(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	ctx := testContext(t)

	short, cancel := context.WithCancel(ctx)
	cancel()
	if reqs, err := s.WaitRequests(short, 1); !errors.Is(err, context.Canceled) || len(reqs) != 0 {
		t.Errorf("WaitRequests on a cancelled context: %d, %v", len(reqs), err)
	}

	got := make(chan []fakemodel.Request, 1)
	go func() {
		reqs, err := s.WaitRequests(ctx, 2)
		if err != nil {
			t.Error(err)
		}
		got <- reqs
	}()
	for _, text := range []string{"one", "two"} {
		decodeOpenAI(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody(text, true)).Body)
	}
	select {
	case reqs := <-got:
		if len(reqs) != 2 || reqs[0].UserText != "one" || reqs[1].UserText != "two" {
			t.Errorf("WaitRequests returned %+v", reqs)
		}
	case <-ctx.Done():
		t.Fatal("WaitRequests did not return")
	}

	s.Close()
	if reqs, err := s.WaitRequests(ctx, 3); !errors.Is(err, fakemodel.ErrClosed) || len(reqs) != 2 {
		t.Errorf("WaitRequests after Close: %d, %v", len(reqs), err)
	}
}

// startHanging sends a streaming request whose reply hangs, and returns
// its body once the first content has arrived.
func startHanging(t *testing.T, ctx context.Context, dc dialectCase, s *fakemodel.Server) *bufio.Reader {
	t.Helper()
	s.Script(fakemodel.Reply{Thinking: "", Text: "HANGMARK and then the rest", Hang: true})
	resp := dc.send(t, ctx, s, "hang", true)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	body := bufio.NewReader(resp.Body)
	readUntil(t, body, "HANGMARK")
	return body
}

func TestHangUnblocksOnClose(t *testing.T) {
	t.Parallel()
	for _, dc := range dialectCases {
		t.Run(dc.name, func(t *testing.T) {
			t.Parallel()
			s := fakemodel.Start(t, dc.cfg)
			ctx := testContext(t)
			body := startHanging(t, ctx, dc, s)

			closed := make(chan struct{})
			go func() {
				s.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-ctx.Done():
				t.Fatal("Close did not return while a reply hung")
			}
			rest, err := io.ReadAll(body)
			if strings.Contains(string(rest), dc.endMarker) || strings.Contains(string(rest), "the rest") {
				t.Errorf("hung stream went on after Close: %q", rest)
			}
			if err == nil {
				t.Errorf("stream ended cleanly after Close; want a cut connection")
			}
			s.Close() // idempotent
		})
	}
}

func TestHangUnblocksOnClientCancel(t *testing.T) {
	t.Parallel()
	for _, dc := range dialectCases {
		t.Run(dc.name, func(t *testing.T) {
			t.Parallel()
			s := fakemodel.Start(t, dc.cfg)
			ctx := testContext(t)

			reqCtx, cancel := context.WithCancel(ctx)
			startHanging(t, reqCtx, dc, s)
			cancel()
			if err := s.WaitIdle(ctx); err != nil {
				t.Fatalf("the hung reply did not notice its client leave: %v", err)
			}

			// A non-streaming request that hangs gets no answer at all.
			s.Script(fakemodel.Reply{Text: "never", Hang: true})
			reqCtx, cancel = context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, s.URL()+"/api/chat",
					strings.NewReader(`{"model":"m","stream":false,"messages":[{"role":"user","content":"x"}]}`))
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			if _, err := s.WaitRequests(ctx, 2); err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-errc; err == nil {
				t.Error("a hung non-streaming request was answered")
			}
			if err := s.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}

			// The server still serves.
			s.Script(fakemodel.Reply{Text: "after"})
			if d := dc.decode(t, dc.send(t, ctx, s, "again", true).Body); d.Text != "after" || !d.Done {
				t.Errorf("after the hang: %+v", d)
			}
		})
	}
}

func TestDelayedStreamCompletes(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{Text: "slow but complete", ChunkSize: 4, Delay: time.Millisecond})
	d := decodeAnthropic(t, post(t, testContext(t), s.URL()+"/v1/messages", anthropicBody("hi", true)).Body)
	if d.Text != "slow but complete" || !d.Done {
		t.Errorf("decoded %+v", d)
	}
}

func TestConcurrentRequests(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		return fakemodel.Reply{Text: "echo " + r.UserText, ChunkSize: 2}
	}})
	ctx := testContext(t)
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		dc := dialectCases[i%len(dialectCases)]
		if dc.cfg.MLX {
			dc = dialectCases[1] // openai; this server is not in mlx mode
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			text := fmt.Sprintf("n%d", i)
			if i%3 == 0 {
				s.Script(fakemodel.Reply{Text: "echo " + text}) // taken by some request; all echo alike
			}
			d := dc.decode(t, dc.send(t, ctx, s, text, true).Body)
			if !strings.HasPrefix(d.Text, "echo n") || !d.Done {
				t.Errorf("%s: %+v", dc.name, d)
			}
		}()
	}
	wg.Wait()
	if got := len(s.Requests()); got != n {
		t.Errorf("%d requests recorded, want %d", got, n)
	}
}

// TestCloseLeavesNoGoroutines runs alone (not in parallel) so that only its
// own server's goroutines could be left.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	s, err := fakemodel.New(fakemodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	startHanging(t, ctx, dialectCases[0], s)
	s.Close()
	s.Close()

	// Handlers are gone when Close returns; the net/http goroutines that
	// ran them may take a moment more.
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "shoal/internal/fakemodel.") && !strings.Contains(stacks, "net/http.(*conn).serve") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("goroutines left after Close:\n%s", stacks)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
