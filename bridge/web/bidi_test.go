package web_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// visualText is what a person reads in an element: its characters in
// the order the browser lays them out (line by line, left to right),
// zero-width ones left out.
const visualText = `((sel) => {
	const out = [];
	const walk = document.createTreeWalker(document.querySelector(sel), NodeFilter.SHOW_TEXT);
	for (let n; (n = walk.nextNode()); ) {
		for (let i = 0; i < n.data.length; i++) {
			const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
			const b = r.getBoundingClientRect();
			if (b.width > 0) out.push([Math.round(b.top / 4), b.left, n.data[i]]);
		}
	}
	out.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
	return out.map((x) => x[2]).join("");
})`

// A model (prompt-injected by a file it read, say) asks to run a Bash
// command with bidirectional overrides in it. The dashboard's permission
// card showed them as they were, so the browser reordered the command:
// bash runs `rm -rf ~/victim` (the first word, the overrides, is not
// found; the rest runs) while the card read as `ls -la` with the rm
// behind a comment. The page shows such characters as \u escapes, and
// the card in the order it runs, as the CLI and the TUI do.
func TestDashboardShowsAPermissionRequestInItsOrder(t *testing.T) {
	t.Parallel()
	d := startDash(t, web.Config{})
	ctx := browser(t)
	cmd := "\u202e\u2066 ;rm -rf ~/victim;\u2069\u2066 # \u2069\u2066ls -la\u2069\u202c"
	in, _ := json.Marshal(map[string]string{"command": cmd, "description": "list the directory"})
	d.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Done."})
	op, err := d.f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir(), Permission: "ask", ID: "bidi"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.f.Send(t.Context(), schemas.SendRequest{AgentID: op.AgentID, Text: "List it."}); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, chromedp.Navigate(d.url+"/agents/bidi"))
	waitJS(t, ctx, "the permission request is shown", `document.querySelector(".permit pre.input")`, 60*time.Second)
	logical := eval[string](t, ctx, `document.querySelector(".permit pre.input").textContent`)
	if !strings.Contains(logical, "rm -rf ~/victim") {
		t.Fatalf("the request's input is not the command asked for: %q", logical)
	}
	seen := eval[string](t, ctx, visualText+`(".permit pre.input")`)
	t.Logf("the card holds %q\nand reads %q", logical, seen)
	if !strings.Contains(seen, "rm -rf ~/victim") || strings.Index(seen, "#") < strings.Index(seen, "rm -rf") {
		t.Errorf("the permission card shows a command other than the one that runs: a person reads\n\t%s\nwhile the agent runs\n\t%q", seen, cmd)
	}
	if !strings.Contains(seen, `\u202e`) || strings.ContainsAny(seen, "\u202e\u2066\u2069\u202c") {
		t.Errorf("the card does not show the overrides as escapes: %q", seen)
	}
	screenshot(t, ctx, "bidi-permit")
}

// An agent is named by its caller: one named constructor (or toString)
// showed "⚠ function Object() { [native code] } waiting" on the fleet page,
// which read its count of waiting requests out of a plain object.
func TestDashboardReadsNoPrototypeForAnAgentsName(t *testing.T) {
	t.Parallel()
	d := startDash(t, web.Config{})
	ctx := browser(t)
	for _, id := range []string{"constructor", "tostring"} {
		if _, err := d.f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir(), ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	do(t, ctx, chromedp.Navigate(d.url+"/"))
	waitJS(t, ctx, "the agents are listed", `document.querySelector('tr[data-agent="constructor"]')`, 60*time.Second)
	if got := eval[string](t, ctx, `document.querySelector('tr[data-agent="constructor"]').textContent`); strings.Contains(got, "waiting") || strings.Contains(got, "function") {
		t.Errorf("the fleet page's row of agent constructor: %q", got)
	}
}
