package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal watch --exec runs its command once per permission request, turn
// end and death of a real claude agent, the moment in its environment,
// and prints a line for each.
func TestWatchRunsACommandPerMoment(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	log := filepath.Join(t.TempDir(), "moments")
	w := startShoal(t, t.TempDir(), c.client, "watch", "--exec", `echo "$SHOAL_MOMENT $SHOAL_AGENT_ID $SHOAL_TURN $SHOAL_REQUEST_ID $SHOAL_TOOL" >> `+log)
	// It follows from the moment it starts, which a loaded machine may
	// delay past the request.
	poll.Until(t, 60*time.Second, "shoal watch starts", func() bool {
		return strings.Contains(w.stderrText(), "shoal: watching")
	})
	id := c.must("open", "--permission", "ask", t.TempDir())
	in, _ := json.Marshal(map[string]string{"command": "echo a && echo b", "description": "run it"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Ran."})
	c.must("send", id, "Run it.")
	var req schemas.PermitRecord
	poll.Until(t, 60*time.Second, "the request waits", func() bool {
		var rep schemas.PendingReply
		json.Unmarshal([]byte(c.must("pending", "--json")), &rep)
		if len(rep.Requests) == 1 {
			req = rep.Requests[0]
		}
		return len(rep.Requests) == 1
	})
	c.must("permit", id, req.RequestID, "allow")
	poll.Until(t, 60*time.Second, "the turn ends", func() bool {
		var rec schemas.AgentRecord
		json.Unmarshal([]byte(c.must("status", "--json", id)), &rec)
		return rec.Status == schemas.StatusIdle
	})
	c.must("close", id)
	want := []string{
		"permission " + id + " 1 " + req.RequestID + " Bash",
		"turn_end " + id + " 1  ",
		"dead " + id + " 1  ",
	}
	var got []string
	poll.Until(t, 30*time.Second, "a command ran per moment", func() bool {
		b, _ := os.ReadFile(log)
		got = strings.Split(strings.TrimSpace(string(b)), "\n")
		return len(got) >= len(want)
	})
	time.Sleep(500 * time.Millisecond) // and no more than once
	b, _ := os.ReadFile(log)
	got = strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the commands' lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	line := w.waitLine(time.Now().Format("2006")) // the first moment's line
	if !strings.Contains(line, id+" permission turn 1: Bash ") || !strings.Contains(line, `echo a && echo b`) || !strings.Contains(line, "shoal permit "+id+" "+req.RequestID) {
		t.Errorf("shoal watch's line for the request: %q", line)
	}
}
