package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal usage --json equals the sum of the result events' usage, read
// independently from the stream (shoal tail --json), per agent and in
// total, and counts an agent closed since; --by node and --by model sum
// the same turns.
func TestUsageEqualsTheStream(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	a := c.must("open", "--id", "spender-a", t.TempDir())
	b := c.must("open", "--id", "spender-b", t.TempDir())
	c.fake.Script(fakemodel.Reply{Text: "one"}, fakemodel.Reply{Text: "two"}, fakemodel.Reply{Text: "three"})
	c.must("run", a, "First.")
	c.must("run", a, "Second.")
	c.must("run", b, "Third.")
	c.must("close", b)

	want := map[string]schemas.Usage{}
	var total schemas.Usage
	turns := 0
	sc := bufio.NewScanner(strings.NewReader(c.must("tail", "--json", "--no-follow")))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var line struct {
			Agent string `json:"agent_id"`
			Kind  string `json:"kind"`
			Data  struct {
				Usage *schemas.Usage `json:"usage"`
			} `json:"data"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Kind != "result" || line.Data.Usage == nil {
			continue
		}
		u := want[line.Agent]
		u.Add(*line.Data.Usage)
		want[line.Agent] = u
		total.Add(*line.Data.Usage)
		turns++
	}
	if turns != 3 || total.InputTokens == 0 || total.OutputTokens == 0 {
		t.Fatalf("the stream's results: %d turns, %+v", turns, total)
	}
	var rep usageReport
	if err := json.Unmarshal([]byte(c.must("usage", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 || rep.Total.Turns != 3 || !sameUsage(rep.Total.Usage, total) {
		t.Fatalf("shoal usage: %+v, want the total %+v", rep, total)
	}
	for _, row := range rep.Rows {
		if !sameUsage(row.Usage, want[row.Key]) {
			t.Errorf("shoal usage for %s: %+v, the stream says %+v", row.Key, row.Usage, want[row.Key])
		}
	}
	for by, key := range map[string]string{"node": "n", "model": "sonnet"} {
		var rep usageReport
		json.Unmarshal([]byte(c.must("usage", "--json", "--by", by)), &rep)
		if len(rep.Rows) != 1 || rep.Rows[0].Key != key || rep.Rows[0].Turns != 3 || !sameUsage(rep.Rows[0].Usage, total) {
			t.Errorf("shoal usage --by %s: %+v", by, rep)
		}
	}
	var one usageReport
	json.Unmarshal([]byte(c.must("usage", "--json", a)), &one)
	if len(one.Rows) != 1 || one.Rows[0].Key != a || !sameUsage(one.Total.Usage, want[a]) {
		t.Errorf("shoal usage %s: %+v", a, one)
	}
	if table := c.must("usage"); !strings.Contains(table, "total") || !strings.Contains(table, a) {
		t.Errorf("shoal usage:\n%s", table)
	}
	if code, _, errOut := c.shoal("usage", "--by", "colour"); code != exitUsage || !strings.Contains(errOut, `--by "colour": agent, node, model or label`) {
		t.Errorf("shoal usage --by colour: exit %d, %q", code, errOut)
	}
}

func sameUsage(a, b schemas.Usage) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// A cost no CLI reported reads "-", never $0: zero is a figure, and
// none was given.
func TestUsageSaysACostNoneReported(t *testing.T) {
	zero := 0.0
	if got := cost(nil); got != "-" {
		t.Errorf("no cost reads %q", got)
	}
	if got := cost(&zero); got != "$0.0000" {
		t.Errorf("a reported $0 reads %q", got)
	}
}
