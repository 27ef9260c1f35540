package schemas

import (
	"math"
	"strings"
	"testing"
)

// Envelopes are written as Kaimon writes them (JSON.jl's JSON.json): only
// '"', '\\' and control characters are escaped (\b \f \n \r \t by name,
// the rest of C0 and DEL as \u00xx); '<', '>', '&', '/', U+2028, U+2029
// and all other characters as they are; a float as Julia shows it (0.0,
// 0.0042, 1.0e-5, 1.0e6). Before, Go's HTML-safe escapes (\u003c,
// \u0026, \u2028) and its floats ("costUsd":0) made the bus's bytes
// differ from Kaimon's wherever a tool call held "&&" or "<".
func TestEnvelopesAreKaimonsBytes(t *testing.T) {
	for _, c := range []struct {
		ev   Event
		want string
	}{
		{Event{Turn: 1, Payload: UserText{Content: Text("a<b>&c/d\"e\\f\x01\x1f\x7f\u0085\u2028\u202e")}},
			"{\"kind\":\"user_text\",\"turn\":1,\"data\":{\"content\":{\"type\":\"text\",\"text\":\"a<b>&c/d\\\"e\\\\f\\u0001\\u001f\\u007f\u0085\u2028\u202e\"}}}"},
		{Event{Turn: 2, Payload: AssistantText{Delta: true, Content: Text("x && y <z>\u2029\b\f\n\r\t\x00")}},
			`{"kind":"assistant_text","turn":2,"data":{"delta":true,"content":{"type":"text","text":"x && y <z>` + "\u2029" + `\b\f\n\r\t\u0000"}}}`},
		{Event{Turn: 3, Payload: Result{StopReason: StopEndTurn, Usage: &Usage{InputTokens: 100, OutputTokens: 5, CostUSD: Cost(0)}}},
			`{"kind":"result","turn":3,"data":{"stopReason":"end_turn","usage":{"inputTokens":100,"outputTokens":5,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":0.0}}}`},
	} {
		got, err := Encode(c.ev)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("%T:\n got %s\nwant %s", c.ev.Payload, got, c.want)
		}
		back, err := Decode(got)
		if err != nil {
			t.Errorf("%T: the envelope does not decode: %v", c.ev.Payload, err)
		} else if again, _ := Encode(back); string(again) != c.want {
			t.Errorf("%T: decoded and written again: %s", c.ev.Payload, again)
		}
	}
	tenth, fifth := 0.1, 0.2 // added at run time, not as exact constants
	for _, c := range []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1, "1.0"}, {1.5, "1.5"}, {0.0042, "0.0042"}, {0.0001, "0.0001"},
		{0.00001, "1.0e-5"}, {0.000012, "1.2e-5"}, {123456, "123456.0"}, {100000, "100000.0"}, {1e6, "1.0e6"},
		{1234567, "1.234567e6"}, {tenth + fifth, "0.30000000000000004"}, {12.345, "12.345"}, {-2.5, "-2.5"},
		{1e21, "1.0e21"}, {5e-324, "5.0e-324"}, {1.7976931348623157e308, "1.7976931348623157e308"}, {999999.5, "999999.5"},
	} {
		if got := string(appendJuliaFloat(nil, c.f)); got != c.want {
			t.Errorf("%v as Julia shows it: %s, want %s", c.f, got, c.want)
		}
	}
}

// An ACP agent Shoal does not know is refused in Kaimon's words.
func TestUnknownACPAgentInKaimonsWords(t *testing.T) {
	_, _, err := SplitACPModel("nosuch:some-model")
	if err == nil || !strings.HasPrefix(err.Error(), "unknown ACP agent 'nosuch' — known: claude, gemini, opencode") {
		t.Errorf("acp:nosuch:some-model: %v", err)
	}
	if agent, model, err := SplitACPModel("gemini:flash"); err != nil || agent != "gemini" || model != "flash" {
		t.Errorf("acp:gemini:flash: %s %s %v", agent, model, err)
	}
}
