package bench

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// TestStandinSpeaksStreamJSON feeds the stand-in two user turns and puts
// what it prints through the claude backend's decoder: each turn is its
// deltas, numbered and stamped in order, and a result counting them.
func TestStandinSpeaksStreamJSON(t *testing.T) {
	in := strings.NewReader(`{"type":"user","message":{"content":[{"type":"text","text":"a"}]}}` + "\n" +
		`{"type":"control_request","request_id":"r1","request":{"subtype":"interrupt"}}` + "\n" +
		`{"type":"user","message":{"content":[{"type":"text","text":"b"}]}}` + "\n")
	var out bytes.Buffer
	if err := standin(in, &out, 50, 0); err != nil {
		t.Fatal(err)
	}
	var d claude.Decoder
	var deltas, results, responses int
	var last, lastPrinted int64
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"control_response"`) {
			responses++
			continue
		}
		for _, p := range d.Line(sc.Bytes(), false) {
			switch p := p.(type) {
			case schemas.AssistantText:
				k, printed, ok := stamp([]byte(`"text":"` + p.Content.Text))
				if !ok || !p.Delta || k != last+1 || printed < lastPrinted {
					t.Fatalf("delta %q after delta %d", p.Content.Text, last)
				}
				last, lastPrinted = k, printed
				deltas++
			case schemas.Result:
				if p.Usage == nil || p.Usage.OutputTokens != last || p.StopReason != schemas.StopEndTurn {
					t.Fatalf("result %+v after %d deltas", p, last)
				}
				last = 0
				results++
			}
		}
	}
	if deltas != 100 || results != 2 || responses != 1 {
		t.Fatalf("%d deltas, %d results, %d control responses; want 100, 2, 1", deltas, results, responses)
	}
}

func TestStampRejectsOtherText(t *testing.T) {
	for _, s := range []string{`"text":"hello"`, `"text":"s12"`, `"text":"s12t34"`, `"text":"st1 "`} {
		if _, _, ok := stamp([]byte(s)); ok {
			t.Errorf("stamp(%s) ok", s)
		}
	}
	if k, p, ok := stamp([]byte(`{"data":{"delta":true,"text":"s12t34 "}}`)); !ok || k != 12 || p != 34 {
		t.Errorf("stamp: %d %d %v", k, p, ok)
	}
}
