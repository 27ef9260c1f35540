package validate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas/validate"
)

// A request is decoded whole before its schema is checked, and a value
// decoded costs far more than its bytes: 8 MiB of empty objects under a
// key the schema does not know (the broker's largest message) took 417
// MiB to refuse, and a fabric service answers any caller's request so,
// an observer's too. A request of more values than any request needs is
// refused before it is decoded; a long text is one value, and what looks
// like JSON inside a string is no value. Not parallel: it counts what
// the process allocates.
func TestRequestsOfTooManyValuesAreRefusedUndecoded(t *testing.T) {
	var wide bytes.Buffer
	wide.WriteString(`{"agent_id":"a","x":[`)
	for wide.Len() < 8<<20-16 {
		wide.WriteString(`{},`)
	}
	wide.WriteString(`{}]}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var v struct {
		AgentID string `json:"agent_id"`
	}
	err := validate.MustCaller("status_request").Decode(wide.Bytes(), &v)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d JSON values", validate.MaxValues)) {
		t.Errorf("8 MiB of empty objects: %v; want refused for its values", err)
	}
	if spent := (after.TotalAlloc - before.TotalAlloc) >> 20; spent > 16 {
		t.Errorf("refusing 8 MiB of empty objects allocated %d MiB", spent)
	}

	text := strings.Repeat(`a, [b: {c}] \"d\", `, 200_000) // 4 MB of one string
	send, _ := json.Marshal(map[string]string{"agent_id": "a", "text": text})
	var s struct {
		Text string `json:"text"`
	}
	if err := validate.MustCaller("send_request").Decode(send, &s); err != nil || s.Text != text {
		t.Errorf("a send of a 4 MB text full of commas and brackets: %v", err)
	}
	agents := make([]string, 10_000)
	for i := range agents {
		agents[i] = fmt.Sprintf("a%d", i)
	}
	replay, _ := json.Marshal(map[string]any{"agents": agents, "follow": true})
	var r struct {
		Agents []string `json:"agents"`
	}
	if err := validate.MustCaller("replay_request").Decode(replay, &r); err != nil || len(r.Agents) != len(agents) {
		t.Errorf("a replay of the most agents a replay names: %v", err)
	}
	// A permission answered with the input its agent asked with, as large
	// as a request may be (1 MiB), of as many values as it may hold.
	input := `{"numbers":[` + strings.Repeat("1,", 500_000) + "1]}"
	permit := []byte(`{"agent_id":"a","request_id":"r","decision":"allow","input":` + input + `}`)
	var p struct {
		Input json.RawMessage `json:"input"`
	}
	if err := validate.MustCaller("permit_request").Decode(permit, &p); err != nil {
		t.Errorf("a permission answered with a 1 MB input of 500,001 values: %v", err)
	}
}
