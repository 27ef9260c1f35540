package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A control error's code is the command's exit status, so a script can
// tell a missing agent from a dead one; the message stays on stderr.
func TestExitStatusNamesTheError(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	kv, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "gone", Status: schemas.StatusDead, Model: "sonnet", CWD: "/", Turn: 1, Node: "lost"})
	if _, err := kv.Put(t.Context(), "gone", rec); err != nil {
		t.Fatal(err)
	}
	env := []string{"SHOAL_NATS=" + b.ClientURL()}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"status", "ghost"}, exitNotFound, "no such agent: ghost"},
		{[]string{"send", "gone", "hello?"}, exitUnavailable, "agent 'gone' is dead: its life on node lost ended; shoal output gone shows how its last turn went, and shoal open --id gone <dir> starts a new life of it"},
		{[]string{"open", t.TempDir()}, exitUnavailable, "no node"},
		{[]string{"status", "Bad_ID"}, exitUsage, "agent id"},
		{[]string{"status"}, exitUsage, ""},
		{[]string{"permit", "--input", "nojson", "a1", "r1", "allow"}, exitUsage, "--input \"nojson\" is not JSON"},
		{[]string{"permit", "a1", "r1", "maybe"}, exitUsage, "want allow or deny"},
		{[]string{"open", "--ask-timeout", "-1s", t.TempDir()}, exitUsage, `flag --ask-timeout: "-1s" is negative`},
		{[]string{"send", "gone", " "}, exitUsage, "the text to send is empty"},
		{[]string{"output", "--turn", "-7", "gone"}, exitUsage, "--turn -7: name a turn by its number"},
		{[]string{"up", "--replicas", "3", "--port", "-1", "--no-node", "--no-mcp", "--no-bus"}, exitUsage, "--replicas 3 needs servers to keep the copies"},
	} {
		code, _, errOut := runShoal(t, t.TempDir(), env, c.args...)
		if code != c.code || !strings.Contains(errOut, c.says) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("shoal %s: exit %d, %q; want exit %d and one line saying %q", strings.Join(c.args, " "), code, errOut, c.code, c.says)
		}
	}
}
