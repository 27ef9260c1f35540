package client_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A coordinator of an earlier version refuses a paged list (it checks
// every argument against its schema): the client asks again for the list
// whole, as that coordinator answers it, and lists it in the order the
// agents were made.
func TestListFromACoordinatorOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	older := natstest.Connect(t, srv)
	var mu sync.Mutex
	var asked []string
	if _, err := older.Subscribe(schemas.FabricSubject(schemas.VerbList), func(m *nats.Msg) {
		mu.Lock()
		asked = append(asked, string(m.Data))
		mu.Unlock()
		var req map[string]any
		json.Unmarshal(m.Data, &req)
		var rep any = schemas.ListReply{Agents: []schemas.AgentRecord{{ID: "b", CreatedAt: 2}, {ID: "a", CreatedAt: 1}}}
		if len(req) > 0 {
			rep = schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid list request: Unknown parameter(s): paged. Valid parameters are: ")}
		}
		out, _ := json.Marshal(rep)
		m.Respond(out)
	}); err != nil {
		t.Fatal(err)
	}
	older.Flush()
	c, err := client.New(natstest.Connect(t, srv), client.Config{ViaCoordinator: true})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := c.List(t.Context())
	mu.Lock()
	defer mu.Unlock()
	if err != nil || len(recs) != 2 || recs[0].ID != "a" || len(asked) != 2 || asked[1] != "{}" {
		t.Errorf("the list from an older coordinator: %+v %v, asked %q", recs, err, asked)
	}
}
