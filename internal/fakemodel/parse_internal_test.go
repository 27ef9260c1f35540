package fakemodel

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParse feeds request bodies to every dialect's parser: none may panic,
// and whatever parses must make a Request and, for auxiliary calls, a
// reply that plans.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"claude-requests.sample.jsonl", "opencode-requests.sample.jsonl", "gemini-requests.sample.jsonl"} {
		raw, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var c struct {
				Body json.RawMessage `json:"body"`
			}
			if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
				f.Fatalf("%s: %v", name, err)
			}
			f.Add([]byte(c.Body))
		}
	}
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"Generate a title for this conversation:\n"}]}`))
	f.Add([]byte(`{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"responseMimeType":"application/json","responseSchema":{"type":"ARRAY","items":{"anyOf":[{"type":"NUMBER"}]}}}}`))
	f.Add([]byte(`{"messages":[{"role":"tool","tool_call_id":"a","content":[{"type":"text","text":"r"}]}]}`))

	f.Fuzz(func(t *testing.T, body []byte) {
		dialects := []dialect{
			anthropicDialect{}, &openaiDialect{}, &mlxDialect{},
			&geminiDialect{model: "m"}, &geminiDialect{model: "m", streaming: true}, ollamaDialect{},
		}
		for _, d := range dialects {
			req, aux, err := d.parse(body)
			if err != nil {
				continue
			}
			if req.Dialect == "" {
				t.Errorf("%T made a request without a dialect", d)
			}
			if aux != nil {
				if _, err := newPlan(*aux, func() string { return "id" }, 1); err != nil {
					t.Errorf("%T: auxiliary reply does not plan: %v", d, err)
				}
			}
		}
	})
}

func TestChunk(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want []string
	}{
		{"", 8, nil},
		{"abc", 8, []string{"abc"}},
		{"abcdefgh", 4, []string{"abcd", "efgh"}},
		{"héllo wörld", 3, []string{"hél", "lo ", "wör", "ld"}},
		{"日本語", 1, []string{"日", "本", "語"}},
	} {
		got := chunk(tc.s, tc.n)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("chunk(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
		for _, c := range got {
			if !utf8.ValidString(c) {
				t.Errorf("chunk(%q, %d) split a rune: %q", tc.s, tc.n, c)
			}
		}
	}
}

func TestStopReasonTranslation(t *testing.T) {
	for _, tc := range []struct {
		d                       Dialect
		stop                    string
		tools                   bool
		want                    string
		toolDefault, endDefault string
	}{
		{DialectAnthropic, "", true, "tool_use", "tool_use", "end_turn"},
		{DialectAnthropic, "", false, "end_turn", "tool_use", "end_turn"},
		{DialectAnthropic, "length", false, "max_tokens", "tool_use", "end_turn"},
		{DialectAnthropic, "pause_turn", false, "pause_turn", "tool_use", "end_turn"},
		{DialectOpenAI, "tool_use", false, "tool_calls", "tool_calls", "stop"},
		{DialectOpenAI, "content_filter", false, "content_filter", "tool_calls", "stop"},
		{DialectGemini, "max_tokens", false, "MAX_TOKENS", "STOP", "STOP"},
		{DialectGemini, "", true, "STOP", "STOP", "STOP"},
		{DialectOllama, "tool_calls", true, "stop", "stop", "stop"},
		{DialectOllama, "length", false, "length", "stop", "stop"},
	} {
		r := Reply{StopReason: tc.stop}
		if tc.tools {
			r.ToolCalls = []ToolCall{{Name: "t"}}
		}
		p, err := newPlan(r, func() string { return "id" }, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.stopReason(tc.d, tc.toolDefault, tc.endDefault); got != tc.want {
			t.Errorf("%s %q (tools %v) = %q, want %q", tc.d, tc.stop, tc.tools, got, tc.want)
		}
	}
}
