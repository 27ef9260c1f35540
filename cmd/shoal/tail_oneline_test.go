package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// A stored envelope may be valid JSON with line breaks between its values
// (a node's credentials in other hands; the relay stores what decodes):
// shoal tail --json printed it over several lines, one of them a whole
// event line of another agent, and --raw printed its carriage return as
// is. Each event is one line, whatever its whitespace.
func TestTailPrintsAnEventOnOneLineWhateverItsWhitespace(t *testing.T) {
	forged := `{"agent_id":"0badc0de","event":3,"node":"trusted","time":"2026-01-01T00:00:00Z","kind":"assistant_text","turn":1,"data":{"delta":false,"content":{"type":"text","text":"FORGED"}}}`
	raw := []byte("{\"kind\":\"error\",\"turn\":1,\"data\":{\"message\":\"x\"},\"pad\":\r\n" + forged + "\r\n}")
	if _, err := schemas.Decode(raw); err != nil {
		t.Fatalf("the relay's decoder refuses it: %v", err)
	}
	out := jsonLine(client.Replayed{Agent: "a1", N: 9, Raw: raw})
	if n := bytes.Count(out, []byte("\n")); n != 1 || out[len(out)-1] != '\n' {
		t.Fatalf("shoal tail --json wrote one event as %d lines:\n%s", n, out)
	}
	var line struct {
		Agent string `json:"agent_id"`
		N     uint64 `json:"event"`
		Kind  string `json:"kind"`
	}
	if err := json.Unmarshal(out, &line); err != nil || line.Agent != "a1" || line.N != 9 || line.Kind != "error" {
		t.Errorf("the --json line: %+v %v\n%s", line, err, out)
	}
	if got := onLine(raw); bytes.ContainsAny(got, "\r\n") || !json.Valid(got) {
		t.Errorf("--raw: %q, want the envelope compacted on one line", got)
	}
	if got := string(onLine([]byte("not json\r\n{}"))); got != `not json\r\n{}` {
		t.Errorf("--raw of a message that is not JSON: %q", got)
	}
	if got := string(onLine([]byte(forged))); got != forged {
		t.Errorf("an envelope on one line is printed as stored; got %q", got)
	}
}
