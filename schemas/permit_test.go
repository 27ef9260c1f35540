package schemas_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// A request past MaxPermitBytes is cut to fit, its input a marker; a list
// of what waits that would not fit one reply takes each agent's oldest
// first, agent by agent, and counts the rest.
func TestPermitsFitTheirBounds(t *testing.T) {
	huge := schemas.PermitRecord{AgentID: "a1", RequestID: "r1", Tool: "Write", Options: []schemas.PermissionOption{},
		Input: json.RawMessage(`{"content":"` + strings.Repeat("\\u0001", 1<<20) + `"}`), Description: strings.Repeat("d", 2<<20)}
	fit := schemas.FitPermit(huge)
	if b, _ := json.Marshal(fit); len(b) > schemas.MaxPermitBytes || !strings.Contains(string(fit.Input), "shoal_truncated") {
		t.Fatalf("a request of %d bytes fits in %d, input %.80s", len(huge.Input), len(b), fit.Input)
	}
	var reqs []schemas.PermitRecord
	for i := range 40 { // the noisy agent's, asked first
		reqs = append(reqs, schemas.PermitRecord{AgentID: "noisy", RequestID: fmt.Sprintf("n%d", i), AskedAt: float64(i),
			Input: json.RawMessage(`"` + strings.Repeat("x", 20<<10) + `"`)})
	}
	reqs = append(reqs, schemas.PermitRecord{AgentID: "quiet", RequestID: "q", AskedAt: 100, Input: json.RawMessage(`{"command":"ls"}`)})
	rep := schemas.PendingWithin(reqs, 100<<10)
	if b, _ := json.Marshal(rep); len(b) > 100<<10 {
		t.Fatalf("the list is %d bytes", len(b))
	}
	if len(rep.Requests) == 0 || rep.Requests[len(rep.Requests)-1].AgentID != "quiet" || rep.Omitted != len(reqs)-len(rep.Requests) || rep.Omitted == 0 {
		t.Fatalf("listed %d (last %s), omitted %d", len(rep.Requests), rep.Requests[len(rep.Requests)-1].AgentID, rep.Omitted)
	}
}

// A request's tool name and options are held to what a list shows, as its
// input is: requests of several agents with huge names (stored by a node
// of Shoal's own before the relay held them) filled a list, and another
// agent's was left out.
func TestPendingHoldsEachRequestsLabels(t *testing.T) {
	var reqs []schemas.PermitRecord
	opts := make([]schemas.PermissionOption, 50)
	for i := range opts {
		opts[i] = schemas.PermissionOption{OptionID: fmt.Sprintf("o%d", i), Name: strings.Repeat("n", 4096), Kind: "allow_once"}
	}
	for i := range 5 {
		reqs = append(reqs, schemas.PermitRecord{AgentID: fmt.Sprintf("loud%d", i), RequestID: "r", Tool: strings.Repeat("T", 200<<10), Options: opts})
	}
	reqs = append(reqs, schemas.PermitRecord{AgentID: "quiet", RequestID: "q", Tool: "Bash", AskedAt: 100, Input: json.RawMessage(`{"command":"ls"}`)})
	rep := schemas.PendingWithin(reqs, 512<<10)
	if len(rep.Requests) != len(reqs) || rep.Omitted != 0 {
		t.Fatalf("listed %d of %d, omitted %d", len(rep.Requests), len(reqs), rep.Omitted)
	}
	for _, r := range rep.Requests[:5] {
		if len(r.Tool) > 2<<10 || len(r.Options) > 16 || len(r.Options[0].Name) > 256 {
			t.Errorf("listed: a tool's name of %d bytes, %d options, an option's name of %d", len(r.Tool), len(r.Options), len(r.Options[0].Name))
		}
	}
	// An option is listed under its own id, which its node takes, or not
	// at all: a cut id would name nothing.
	long := strings.Repeat("x", 200)
	fit := schemas.FitPermit(schemas.PermitRecord{AgentID: "a", RequestID: "r", Tool: "bash", Options: append([]schemas.PermissionOption{{OptionID: long, Name: "Allow", Kind: "allow_once"}}, opts...)})
	if len(fit.Options) != 16 || fit.Options[0].OptionID != "o0" || fit.Options[15].OptionID != "o15" {
		t.Errorf("an option with a %d-byte id among 51: kept %d, first %.20q", len(long), len(fit.Options), fit.Options[0].OptionID)
	}
}
