package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// streamSpend is what the result events of the stream say the turns
// used, read apart from the coordinator's count: per agent and in all,
// with how many turns began and how many were refused before they began
// for a budget.
type streamSpend struct {
	total   schemas.Usage
	turns   int // results with usage
	refused int // turns refused at their start for a budget
	cut     int // turns interrupted as they crossed a budget
}

func readStreamSpend(t *testing.T, client []string) streamSpend {
	t.Helper()
	code, out, errOut := runShoal(t, t.TempDir(), client, "tail", "--json", "--no-follow")
	if code != 0 {
		t.Fatalf("shoal tail: exit %d: %s", code, errOut)
	}
	var s streamSpend
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var line struct {
			Kind string `json:"kind"`
			Data struct {
				Usage   *schemas.Usage `json:"usage"`
				Message string         `json:"message"`
			} `json:"data"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch {
		case line.Kind == "result" && line.Data.Usage != nil:
			s.total.Add(*line.Data.Usage)
			s.turns++
		case line.Kind == "error" && strings.Contains(line.Data.Message, "was refused before it began: the fleet has used"):
			s.refused++
		case line.Kind == "error" && strings.Contains(line.Data.Message, "passed its budget: the fleet has used"):
			s.cut++
		}
	}
	return s
}

// A fleet budget across two nodes and ten agents: spend stops within the
// documented overshoot (one turn per agent running when the budget is
// reached), and after a node and the coordinator are SIGKILLed and
// restarted in the middle, the coordinator's count, shoal usage and the
// stream's result events agree exactly.
func TestFleetBudgetAcrossTwoNodes(t *testing.T) {
	t.Parallel()
	const perTurn = 120 // the fake model's usage: 100 in, 20 out
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply {
		return fakemodel.Reply{Text: "spent some", Usage: fakemodel.Usage{Input: 100, Output: 20}, Delay: 20 * time.Millisecond}
	}})
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	url := "nats://127.0.0.1:" + port
	client := []string{"SHOAL_NATS=" + url}
	claude := peers.Claude.Command(t)[0]
	budget := 25 * perTurn
	upEnv := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	coordinator := func() *shoalProc {
		p := startShoal(t, dir, upEnv, "up", "--port", port, "--node-name", "n", "--node-ttl", "2s", "--mcp-listen", "127.0.0.1:0", "--no-bus",
			"--claude", claude, "--budget-tokens", strconv.Itoa(budget))
		p.waitLine("shoal: ready")
		return p
	}
	up := coordinator()
	farHome := filepath.Join(dir, "far")
	farEnv := append(peers.ClaudeEnv(filepath.Join(farHome, "claude"), fake.URL()), "XDG_CACHE_HOME="+farHome+"/cache")
	node := func() *shoalProc {
		p := startShoal(t, farHome, farEnv, "node", "--nats", url, "--name", "m", "--claude", claude, "--stop-wait", "500ms")
		p.waitLine("shoal: node m joined")
		return p
	}
	far := node()
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), client, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
		}
		return strings.TrimSpace(out)
	}
	open := func() []string {
		var ids []string
		for i := range 10 {
			ids = append(ids, must("open", "--node", []string{"n", "m"}[i%2], t.TempDir()))
		}
		return ids
	}
	// Before: a turn each, well within the budget.
	ids := open()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if code, _, errOut := runShoal(t, t.TempDir(), client, "run", id, "Spend a little."); code != 0 {
				t.Errorf("shoal run %s: exit %d: %s", id, code, errOut)
			}
		})
	}
	wg.Wait()

	// The node and the coordinator die and come back.
	far.stop(syscall.SIGKILL)
	node()
	up.stop(syscall.SIGKILL)
	coordinator()
	// After: ten fresh agents (the first on m once it answers the
	// coordinator that came back), six turns each sent at once, far past
	// the budget.
	var first string
	poll.Until(t, 60*time.Second, "node m answers again", func() bool {
		code, out, _ := runShoal(t, t.TempDir(), client, "open", "--node", "m", t.TempDir())
		first = strings.TrimSpace(out)
		return code == 0
	})
	ids = append([]string{first}, open()[1:]...)
	refusedAtSend := 0
	var mu sync.Mutex
	for _, id := range ids {
		wg.Go(func() {
			for i := range 6 {
				code, _, errOut := runShoal(t, t.TempDir(), client, "send", id, fmt.Sprintf("Spend more, %d.", i))
				switch {
				case code == exitUnavailable && strings.Contains(errOut, "the fleet has used "):
					mu.Lock()
					refusedAtSend++
					mu.Unlock()
				case code != 0:
					t.Errorf("shoal send %s: exit %d: %s", id, code, errOut)
				}
			}
		})
	}
	wg.Wait()
	var busy []string
	deadline := time.Now().Add(3 * time.Minute)
	for {
		busy = nil
		for _, id := range ids {
			var rec schemas.AgentRecord
			code, out, _ := runShoal(t, t.TempDir(), client, "status", "--json", id)
			if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || rec.Status != schemas.StatusIdle || rec.Held > 0 {
				busy = append(busy, fmt.Sprintf("%s %s held %d", id, rec.Status, rec.Held))
			}
		}
		if len(busy) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents still busy after 3 minutes: %v", busy)
		}
		time.Sleep(500 * time.Millisecond)
	}

	s := readStreamSpend(t, client)
	used := schemas.TokensOf(s.total)
	t.Logf("%d turns used %d tokens of a budget of %d; %d refused at their start, %d at send, %d interrupted", s.turns, used, budget, s.refused, refusedAtSend, s.cut)
	if used < int64(budget) {
		t.Errorf("the turns used %d tokens, short of the budget of %d: spend stopped early", used, budget)
	}
	if over := used - int64(budget); over > 10*perTurn {
		t.Errorf("the fleet overshot its budget by %d tokens, more than one turn (%d) per agent", over, perTurn)
	}
	if s.refused+refusedAtSend == 0 {
		t.Errorf("no turn was refused for the fleet's budget")
	}
	// Exact, across the restarts: the count, shoal usage and the stream.
	var rep usageReport
	if err := json.Unmarshal([]byte(must("usage", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if !sameUsage(rep.Total.Usage, s.total) || rep.Total.Turns != s.turns {
		t.Errorf("shoal usage says %d turns, %+v; the stream %d, %+v", rep.Total.Turns, rep.Total.Usage, s.turns, s.total)
	}
	var line schemas.BudgetLine
	poll.Until(t, 30*time.Second, "the coordinator's count reaches the stream's", func() bool {
		json.Unmarshal([]byte(must("budget", "--fleet", "--json")), &line)
		return sameUsage(line.Used, s.total)
	})
	if line.Budget.Tokens != int64(budget) {
		t.Errorf("the fleet's budget reads %+v, want %d tokens", line.Budget, budget)
	}
	if code, _, errOut := runShoal(t, t.TempDir(), nil, "up", "--budget-tokens", "-1"); code != exitUsage || !strings.Contains(errOut, "a budget is 0 (no limit) or more") {
		t.Errorf("shoal up with a negative fleet budget: exit %d, %q", code, errOut)
	}
	if table := must("budget"); !strings.Contains(table, "the fleet  ") || !strings.Contains(table, strconv.Itoa(budget)) ||
		!strings.Contains(table, fmt.Sprintf("the fleet's turns used %d tokens", used)) {
		t.Errorf("shoal budget does not list the fleet's budget and spend:\n%s", table)
	}
}

// A label's budget holds the agents of the nodes that carry the label: a
// turn that crosses it is interrupted as it runs (exit 7, an error event
// naming the label's budget), the next is refused before it begins (exit
// 4, naming it and how to raise it), and once it is lifted the agent goes
// on; shoal usage --by label sums the turns of the label's nodes.
func TestLabelBudgetHoldsItsNodesAgents(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--labels", "team=a")
	spend := fakemodel.Usage{Input: 100, Output: 20}
	c.fake.Script(fakemodel.Reply{Text: "one", Usage: spend}, fakemodel.Reply{Text: "two", Usage: spend, Delay: 50 * time.Millisecond},
		fakemodel.Reply{Text: "four", Usage: spend}, fakemodel.Reply{Text: "five", Usage: spend})
	if out := c.must("budget", "set", "--label", "team=a", "--tokens", "200"); !strings.Contains(out, "label team=a: budget 200 tokens; used 0 tokens") {
		t.Errorf("shoal budget set --label: %q", out)
	}
	id := c.must("open", t.TempDir())
	if out := c.must("run", id, "One."); out != "one" {
		t.Fatalf("the first turn: %q", out)
	}
	if code, _, errOut := c.shoal("run", id, "Two."); code != exitCancelled {
		t.Errorf("the turn that crossed the label's budget: exit %d, %q", code, errOut)
	}
	if tail := c.must("tail", "--no-follow", id); !strings.Contains(tail, "turn 2 passed its budget: label team=a has used ") {
		t.Errorf("the stream does not say why turn 2 was interrupted:\n%s", tail)
	}
	code, _, errOut := c.shoal("send", id, "Three.")
	if code != exitUnavailable || !strings.Contains(errOut, "label team=a has used ") ||
		!strings.Contains(errOut, "of its budget of 200: raise it with shoal budget set --label team=a --tokens N") {
		t.Errorf("a turn past the label's budget: exit %d, %q", code, errOut)
	}
	c.must("budget", "set", "--label", "team=a", "--tokens", "0")
	if out := c.must("run", id, "Four."); out == "" {
		t.Errorf("the turn after the label's budget was lifted said nothing")
	}
	var byLabel, byNode usageReport
	json.Unmarshal([]byte(c.must("usage", "--json", "--by", "label")), &byLabel)
	json.Unmarshal([]byte(c.must("usage", "--json", "--by", "node")), &byNode)
	if len(byLabel.Rows) != 1 || byLabel.Rows[0].Key != "team=a" || byLabel.Rows[0].Turns != 3 || len(byNode.Rows) != 1 ||
		!sameUsage(byLabel.Rows[0].Usage, byNode.Rows[0].Usage) {
		t.Errorf("shoal usage --by label: %+v; by node: %+v", byLabel, byNode)
	}
	if code, _, errOut := c.shoal("budget", "set", "--label", "nolabel", "--tokens", "5"); code != exitUsage || !strings.Contains(errOut, `label "nolabel" is not key=value`) {
		t.Errorf("a label that is not key=value: exit %d, %q", code, errOut)
	}
	if code, _, errOut := c.shoal("budget", "set", "--tokens", "5"); code != exitUsage || !strings.Contains(errOut, "names what it sets") {
		t.Errorf("shoal budget set naming nothing: exit %d, %q", code, errOut)
	}
	if code, _, errOut := c.shoal("budget", "set", id, "--fleet", "--tokens", "5"); code != exitUsage || !strings.Contains(errOut, "name exactly one") {
		t.Errorf("shoal budget set naming two: exit %d, %q", code, errOut)
	}
}

// Over MCP: agent_open takes a budget, a turn past it is refused with
// the budget named in the tool's error text, and a budget that is no
// budget is refused by its argument's name.
func TestMCPHoldsAnAgentToItsBudget(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	// The reply streams slowly enough for the interrupt to reach the CLI
	// before its turn ends of itself (its usage comes with the first frame).
	c.fake.Script(fakemodel.Reply{Text: "once", Usage: fakemodel.Usage{Input: 100, Output: 20}, Delay: 50 * time.Millisecond})
	cl := mcp.NewClient(&mcp.Implementation{Name: "budget-test", Version: "1"}, nil)
	s, err := cl.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: c.printed("MCP endpoint "), HTTPClient: &http.Client{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	call := func(tool string, args map[string]any) (string, bool) {
		t.Helper()
		text, isErr, err := callText(t.Context(), s, tool, args)
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		return text, isErr
	}
	if text, isErr := call("agent_open", map[string]any{"cwd": t.TempDir(), "id": "thrifty", "budget_tokens": 50}); isErr {
		t.Fatalf("agent_open with a budget: %s", text)
	}
	if text, _ := call("agent_run", map[string]any{"agent_id": "thrifty", "text": "Spend it."}); !strings.Contains(text, "cancelled") {
		t.Errorf("agent_run of the turn that crossed the budget: %s", text)
	}
	for _, tool := range []string{"agent_send", "agent_run"} {
		text, isErr := call(tool, map[string]any{"agent_id": "thrifty", "text": "More."})
		if !isErr || !strings.Contains(text, "agent thrifty has used ") || !strings.Contains(text, "tokens of its budget of 50: raise it with shoal budget set thrifty --tokens N") {
			t.Errorf("%s past the budget: error %v, %q", tool, isErr, text)
		}
	}
	if text, isErr := call("agent_open", map[string]any{"cwd": t.TempDir(), "budget_tokens": 0}); !isErr || !strings.Contains(text, "budget_tokens") {
		t.Errorf("agent_open with a budget of 0 tokens: error %v, %q", isErr, text)
	}
}

// Scoped credentials reach the budgets through the coordinator's fabric
// service: a client's set the fleet's and an agent's and read them back;
// an observer's read them and set none (refused by the rights rules).
func TestBudgetsThroughTheFabricService(t *testing.T) {
	t.Parallel()
	p := startAuthPool(t, "client", "alice")
	if out := p.must(t, "budget", "set", "--fleet", "--tokens", "5000", "--usd", "2"); !strings.Contains(out, "the fleet: budget 5000 tokens, $2.0000; used 0 tokens") {
		t.Errorf("shoal budget set --fleet as a client: %q", out)
	}
	id := p.must(t, "open", "--budget-tokens", "700", t.TempDir())
	if out := p.must(t, "budget", id); !strings.Contains(out, "agent "+id+": budget 700 tokens; used 0 tokens") {
		t.Errorf("shoal budget %s as a client: %q", id, out)
	}
	var rep schemas.BudgetsReply
	if err := json.Unmarshal([]byte(p.must(t, "budget", "--json")), &rep); err != nil || len(rep.Budgets) != 2 {
		t.Errorf("shoal budget --json as a client: %+v %v", rep, err)
	}
	observer := filepath.Join(p.dir, "watcher.creds")
	if code, _, errOut := runShoal(t, p.dir, nil, "creds", "observer", "watcher", "--out", observer, "--auth-dir", filepath.Join(p.dir, "keys")); code != 0 {
		t.Fatal(errOut)
	}
	as := []string{"SHOAL_NATS=" + p.url, "SHOAL_CREDS=" + observer}
	if code, out, errOut := runShoal(t, t.TempDir(), as, "budget"); code != 0 || !strings.Contains(out, "the fleet") {
		t.Errorf("shoal budget as an observer: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := runShoal(t, t.TempDir(), as, "budget", "set", "--fleet", "--tokens", "1"); code != exitUsage || !strings.Contains(errOut, "budget") {
		t.Errorf("shoal budget set as an observer: exit %d, %q", code, errOut)
	}
}
