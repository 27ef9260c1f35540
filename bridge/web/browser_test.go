package web_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/schemas"
)

// thinking is long enough, streamed four runes at a time, to be seen
// growing.
var thinking = strings.Repeat("Let me look at the directory before answering. ", 6)

func bashReply(cmd string) fakemodel.Reply {
	in, _ := json.Marshal(map[string]string{"command": cmd, "description": "list it"})
	return fakemodel.Reply{Thinking: thinking, Text: "I will run a command.", ChunkSize: 4, Delay: 25 * time.Millisecond,
		ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
}

// In a real Chromium, with the full token: an agent opened from the fleet
// page (permission ask) takes a turn sent from its page; its thinking
// streams (the text grows before the turn ends); the stream is cut
// mid-turn and the browser resumes it with Last-Event-ID, receiving every
// stored event once, in order; the Bash call's permission request shows
// the command and is allowed from the page; the tool runs and its card
// opens on the result; the turn ends with its usage. The fleet page then
// shows the agent, its node and its tokens; both pages are screenshotted,
// also at a phone's width, and every control has an accessible name.
func TestDashboardDrivesAnAgent(t *testing.T) {
	t.Parallel()
	const token = "full-secret"
	d := startDash(t, web.Config{Token: token, ObserverToken: "observer-secret"})
	ctx := browser(t)
	d.fake.Script(bashReply("echo from-the-tool"), fakemodel.Reply{Text: "The tool said from-the-tool.", ChunkSize: 4, Delay: 10 * time.Millisecond})

	do(t, ctx, chromedp.Navigate(d.url+"/?token="+token))
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); loc != d.url+"/" {
		t.Errorf("the login left the token in the address: %s", loc)
	}
	waitJS(t, ctx, "the fleet page knows its role", `window.shoal.role === "full"`, 10*time.Second)
	waitJS(t, ctx, "the node is listed", `document.querySelector('#nodes tr[data-node="n1"]')`, 20*time.Second)
	waitJS(t, ctx, "the form offers the presets", `window.shoal.presets`, 10*time.Second)
	eval[bool](t, ctx, `(() => { const f = document.querySelector("#open-form");
		f.elements.cwd.value = `+jsString(t.TempDir())+`; f.elements.permission.value = "ask"; f.elements.id.value = "web1";
		f.requestSubmit(); return true })()`)
	waitJS(t, ctx, "the open went to the agent's page", `location.pathname === "/agents/web1" && document.querySelector("#agent-id").textContent === "web1"`, 60*time.Second)
	waitJS(t, ctx, "the stream is live", `window.shoal.connects >= 1`, 10*time.Second)

	eval[bool](t, ctx, `(() => { const f = document.querySelector("#send-form"); f.elements.text.value = "List the directory."; f.requestSubmit(); return true })()`)

	// The thinking grows while the turn runs.
	type progress struct {
		Thought int  `json:"thought"`
		Ended   bool `json:"ended"`
	}
	const measure = `(() => ({thought: [...document.querySelectorAll(".thought")].reduce((n, e) => n + e.textContent.length, 0),
		ended: !!document.querySelector("[data-turn-end]")}))()`
	var lengths []int
	deadline := time.Now().Add(60 * time.Second)
	for len(lengths) < 3 {
		p := eval[progress](t, ctx, measure)
		if p.Ended {
			t.Fatalf("the turn ended before its text was seen growing: %v", lengths)
		}
		if p.Thought > 0 && (len(lengths) == 0 || p.Thought > lengths[len(lengths)-1]) {
			lengths = append(lengths, p.Thought)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the thinking did not stream: %v; the page says %s", lengths, eval[string](t, ctx, "document.body.innerText"))
		}
		time.Sleep(30 * time.Millisecond)
	}
	if p := eval[progress](t, ctx, measure); p.Thought >= len(thinking) || p.Ended {
		t.Fatalf("the thinking was complete before the stream was cut: %+v", p)
	}
	d.cut() // mid-turn: the browser must resume
	waitJS(t, ctx, "the browser reconnected", `window.shoal.connects >= 2`, 20*time.Second)

	// The permission request shows the command; the page allows it.
	waitJS(t, ctx, "the permission request is shown", `document.querySelector(".permit button.allow")`, 60*time.Second)
	if in := eval[string](t, ctx, `document.querySelector(".permit pre.input").textContent`); !strings.Contains(in, "echo from-the-tool") {
		t.Errorf("the request's input on the page: %q", in)
	}
	eval[bool](t, ctx, `(document.querySelector(".permit button.allow").click(), true)`)
	waitJS(t, ctx, "the turn ended", `document.querySelector('[data-turn-end="1"]')`, 60*time.Second)
	end := eval[string](t, ctx, `document.querySelector('[data-turn-end="1"]').textContent`)
	if !strings.Contains(end, "end_turn") || !strings.Contains(end, " in, ") || !strings.Contains(end, " out") {
		t.Errorf("the turn's end shows no usage: %q", end)
	}
	if th := eval[string](t, ctx, `document.querySelector(".thought").textContent`); th != thinking {
		t.Errorf("the authoritative thought did not replace the deltas: %q", th)
	}
	if text := eval[string](t, ctx, `[...document.querySelectorAll(".text")].map(e => e.textContent).join("|")`); !strings.Contains(text, "The tool said from-the-tool.") {
		t.Errorf("the texts on the page: %q", text)
	}

	// The tool card opens on its input and result.
	eval[bool](t, ctx, `(document.querySelector("details.tool > summary").click(), true)`)
	waitJS(t, ctx, "the tool card opened", `document.querySelector("details.tool").open`, 5*time.Second)
	card := eval[string](t, ctx, `document.querySelector("details.tool").innerText`)
	if !strings.Contains(card, "Bash") || !strings.Contains(card, "echo from-the-tool") || !strings.Contains(card, "from-the-tool\n") && !strings.HasSuffix(strings.TrimSpace(card), "from-the-tool") {
		t.Errorf("the tool card: %q", card)
	}
	if rec, err := d.f.Pending(t.Context()); err != nil || len(rec.Requests) != 0 {
		t.Errorf("requests still pending: %+v %v", rec, err)
	}

	// Every stored event arrived once, in order, across the cut.
	waitJS(t, ctx, "the agent is idle", `document.querySelector('[data-fact="status"] dd').textContent === "idle"`, 30*time.Second)
	var received []uint64
	deadline = time.Now().Add(10 * time.Second)
	for {
		stored := d.stored("web1")
		received = eval[[]uint64](t, ctx, `window.shoal.received`)
		if slices.Equal(received, stored) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page received %v\nthe stream holds %v", received, stored)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d events received over %d connections", len(received), eval[int](t, ctx, "window.shoal.connects"))
	checkNames(t, ctx)
	screenshot(t, ctx, "agent")

	// The fleet page: the agent, its tokens per node and per model.
	do(t, ctx, chromedp.Navigate(d.url+"/"))
	waitJS(t, ctx, "the agent is listed", `document.querySelector('#agents tr[data-agent="web1"] .status.idle')`, 10*time.Second)
	rec, err := d.f.Status(t.Context(), "web1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Usage.OutputTokens == 0 {
		t.Fatalf("the agent's record counts no tokens: %+v", rec.Usage)
	}
	row := eval[string](t, ctx, `document.querySelector('#agents tr[data-agent="web1"]').innerText`)
	for _, want := range []string{rec.Model, "n1", rec.CWD} {
		if !strings.Contains(row, want) {
			t.Errorf("the agent's row %q lacks %q", row, want)
		}
	}
	out := eval[string](t, ctx, `document.querySelector('#by-node tr[data-key="n1"] td:nth-child(3)').textContent`)
	if out != formatted(rec.Usage.OutputTokens) {
		t.Errorf("node n1's output tokens: %q, want %d", out, rec.Usage.OutputTokens)
	}
	if got := eval[bool](t, ctx, `!!document.querySelector('#by-model tr[data-key=`+jsString(rec.Model)+`]')`); !got {
		t.Errorf("no token total for model %s", rec.Model)
	}
	// The spend: the coordinator's count of the fleet's turns, and the
	// fleet's budget, reached.
	if err := d.f.SetBudget(t.Context(), schemas.BudgetRequest{Fleet: true, Tokens: 10}); err != nil {
		t.Fatal(err)
	}
	want := "The fleet's turns used " + formatted(schemas.TokensOf(rec.Usage)) + " tokens, cost $0.0000, in 1 turns."
	waitJS(t, ctx, "the fleet's spend is shown", `document.querySelector("#fleet-spend").textContent === `+jsString(want), 20*time.Second)
	waitJS(t, ctx, "the fleet's budget is shown, reached", `(document.querySelector('#budgets tr[data-budget="the fleet"]') || {innerText: ""}).innerText.includes("reached")`, 20*time.Second)
	if b := eval[string](t, ctx, `document.querySelector('#budgets tr[data-budget="the fleet"]').innerText`); !strings.Contains(b, "10 tokens") {
		t.Errorf("the fleet's budget row: %q", b)
	}
	if c := eval[string](t, ctx, `document.querySelector('#agents tr[data-agent="web1"] .cost').textContent`); c != "$0.0000" {
		t.Errorf("the agent's cost: %q", c)
	}
	eval[bool](t, ctx, `(() => { const f = document.querySelector("#filter"); f.value = "no-such-agent"; f.dispatchEvent(new Event("input")); return true })()`)
	if n := eval[int](t, ctx, `document.querySelectorAll("#agents tbody tr").length`); n != 0 {
		t.Errorf("the filter left %d agents", n)
	}
	eval[bool](t, ctx, `(() => { const f = document.querySelector("#filter"); f.value = ""; f.dispatchEvent(new Event("input")); return true })()`)
	checkNames(t, ctx)
	screenshot(t, ctx, "fleet")

	// A phone's width: nothing runs off the side.
	do(t, ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Navigate(d.url+"/agents/web1"))
	waitJS(t, ctx, "the agent page on a phone", `document.querySelector('[data-turn-end="1"]')`, 20*time.Second)
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth - window.innerWidth`); w > 0 {
		t.Errorf("the agent page is %dpx wider than a phone", w)
	}
	screenshot(t, ctx, "agent-phone")
	do(t, ctx, chromedp.Navigate(d.url+"/"))
	waitJS(t, ctx, "the fleet page on a phone", `document.querySelector('#agents tr[data-agent="web1"]')`, 20*time.Second)
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth - window.innerWidth`); w > 0 {
		t.Errorf("the fleet page is %dpx wider than a phone", w)
	}
}

// formatted is a count as the page writes it (toLocaleString("en")).
func formatted(n int64) string {
	s := strconv.FormatInt(n, 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// checkNames fails on a visible control without an accessible name.
func checkNames(t *testing.T, ctx context.Context) {
	t.Helper()
	unnamed := eval[[]string](t, ctx, `[...document.querySelectorAll("button, input, select, textarea, summary")]
		.filter(e => e.offsetParent !== null)
		.filter(e => !(e.labels && e.labels.length) && !e.getAttribute("aria-label") && !e.textContent.trim())
		.map(e => e.outerHTML)`)
	if len(unnamed) > 0 {
		t.Errorf("controls without an accessible name: %v", unnamed)
	}
}

// In a real Chromium: an agent opened from the fleet page on a repository
// of the dashboard's machine gets its own checkout; its page names the
// repository and branch, and, once its Bash tool has added a file, shows
// the change as a diff. An observer sees the diff too; it cannot open.
func TestDashboardWorksOnARepository(t *testing.T) {
	t.Parallel()
	const token = "full-secret"
	d := startDash(t, web.Config{Token: token, ObserverToken: "observer-secret"})
	ctx := browser(t)
	repo := filepath.Join(t.TempDir(), "repo")
	gittest.Git(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	gittest.Git(t, repo, "add", ".")
	gittest.Git(t, repo, "commit", "-q", "-m", "first")
	head := gittest.Git(t, repo, "rev-parse", "HEAD")
	in, _ := json.Marshal(map[string]string{"command": "echo from-web > web.txt", "description": "write"})
	d.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})

	do(t, ctx, chromedp.Navigate(d.url+"/?token="+token))
	waitJS(t, ctx, "the node is listed", `document.querySelector('#nodes tr[data-node="n1"]')`, 20*time.Second)
	eval[bool](t, ctx, `(() => { const f = document.querySelector("#open-form");
		f.elements.cwd.value = `+jsString(repo)+`; f.elements.repo.checked = true; f.elements.id.value = "webrepo";
		f.requestSubmit(); return true })()`)
	waitJS(t, ctx, "the open went to the agent's page", `location.pathname === "/agents/webrepo"`, 60*time.Second)
	waitJS(t, ctx, "the page names the repository", `!document.querySelector("#changes").hidden &&
		document.querySelector('[data-fact="repository"] dd').textContent.includes("shoal/webrepo from `+head[:12]+`")`, 20*time.Second)
	if fact := eval[string](t, ctx, `document.querySelector('[data-fact="repository"] dd').textContent`); !strings.HasPrefix(fact, repo+" ") {
		t.Errorf("the repository fact: %q", fact)
	}
	rep, err := d.f.Run(t.Context(), schemas.RunRequest{AgentID: "webrepo", Text: "Write web.txt."})
	if err != nil || rep.Text != "Written." {
		t.Fatalf("the turn: %+v %v", rep, err)
	}
	eval[bool](t, ctx, `(document.querySelector("#show-diff").click(), true)`)
	waitJS(t, ctx, "the diff is shown", `document.querySelector("#diff").dataset.files === "1"`, 30*time.Second)
	if diff := eval[string](t, ctx, `document.querySelector("#diff").textContent`); !strings.Contains(diff, "web.txt") || !strings.Contains(diff, "+from-web") {
		t.Errorf("the diff on the page: %q", diff)
	}
	checkNames(t, ctx)
	screenshot(t, ctx, "agent-repository")

	// The observer reads the same diff, and may not open on a repository.
	observer := browser(t)
	do(t, observer, chromedp.Navigate(d.url+"/agents/webrepo?token=observer-secret"))
	waitJS(t, observer, "the observer sees the changes section", `!document.querySelector("#changes").hidden`, 20*time.Second)
	eval[bool](t, observer, `(document.querySelector("#show-diff").click(), true)`)
	waitJS(t, observer, "the observer's diff is shown", `document.querySelector("#diff").dataset.files === "1"`, 30*time.Second)
	status := eval[int](t, observer, `fetch("/api/open", {method: "POST", headers: {"Content-Type": "application/json"},
		body: JSON.stringify({cwd: `+jsString(repo)+`, repo: true})}).then(r => r.status)`)
	if status != http.StatusForbidden {
		t.Errorf("an observer's open on a repository: HTTP %d", status)
	}
}

// The Open form offers the presets the open request's schema lists, no
// others, and an agent opens with each; Close and Interrupt act on a
// second click only; Set model says how it went; a wrong token is told
// so on the sign-in page.
func TestDashboardOffersThePresetsAnOpenTakes(t *testing.T) {
	t.Parallel()
	const token = "full-secret"
	d := startDash(t, web.Config{Token: token})
	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(d.url+"/?token=wrong"))
	if page := eval[string](t, ctx, "document.body.innerText"); !strings.Contains(page, "The token you signed in with is not this coordinator's") {
		t.Errorf("the sign-in page after a wrong token:\n%s", page)
	}
	do(t, ctx, chromedp.Navigate(d.url+"/?token="+token))
	waitJS(t, ctx, "the node is listed", `document.querySelector('#nodes tr[data-node="n1"]')`, 20*time.Second)
	waitJS(t, ctx, "the form offers the presets", `window.shoal.presets`, 10*time.Second)
	raw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/control/open_request.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Permission struct{ Enum []string } `json:"permission"`
		} `json:"properties"`
	}
	json.Unmarshal(raw, &schema)
	offered := eval[[]string](t, ctx, `[...document.querySelectorAll("#presets option")].map(o => o.value)`)
	if !slices.Equal(offered, schema.Properties.Permission.Enum) || len(offered) < 7 {
		t.Fatalf("the form offers %v; the open request takes %v", offered, schema.Properties.Permission.Enum)
	}
	for _, preset := range offered {
		do(t, ctx, chromedp.Navigate(d.url+"/"))
		waitJS(t, ctx, "the form offers the presets", `window.shoal.presets`, 10*time.Second)
		id := "p-" + preset
		eval[bool](t, ctx, `(() => { const f = document.querySelector("#open-form");
			f.elements.cwd.value = `+jsString(t.TempDir())+`; f.elements.permission.value = `+jsString(preset)+`; f.elements.id.value = `+jsString(id)+`;
			f.requestSubmit(); return true })()`)
		waitJS(t, ctx, "the open with "+preset+" went to the agent's page", `location.pathname === "/agents/`+id+`" || document.querySelector("#open-error").textContent`, 60*time.Second)
		if e := eval[string](t, ctx, `document.querySelector("#open-error") ? document.querySelector("#open-error").textContent : ""`); e != "" && !strings.HasPrefix(eval[string](t, ctx, "location.pathname"), "/agents/") {
			t.Errorf("opening with preset %s: %s", preset, e)
		}
	}

	// On the last agent's page: Set model says why it did not switch; a
	// first click on Close only asks.
	waitJS(t, ctx, "the agent is idle", `document.querySelector('[data-fact="status"] dd') && document.querySelector('[data-fact="status"] dd').textContent === "idle"`, 60*time.Second)
	eval[bool](t, ctx, `(() => { const f = document.querySelector("#model-form"); f.elements.model.value = "opus"; f.requestSubmit(); return true })()`)
	waitJS(t, ctx, "the model's outcome is said", `document.querySelector("#act-status").textContent.startsWith("not switched: ")`, 20*time.Second)
	last := "p-" + offered[len(offered)-1]
	eval[bool](t, ctx, `(document.querySelector("#close").click(), true)`)
	if got := eval[string](t, ctx, `document.querySelector("#close").textContent`); got != "Close: click again" {
		t.Errorf("the close button after one click: %q", got)
	}
	time.Sleep(time.Second)
	if rec, err := d.f.Record(t.Context(), last); err != nil || rec.Status == schemas.StatusDead {
		t.Fatalf("one click closed the agent: %+v %v", rec, err)
	}
	eval[bool](t, ctx, `(document.querySelector("#close").click(), true)`)
	waitJS(t, ctx, "the close is said", `document.querySelector("#act-status").textContent === "closed"`, 30*time.Second)
	if rec, err := d.f.Record(t.Context(), last); err != nil || rec.Status != schemas.StatusDead {
		t.Errorf("after the second click: %+v %v", rec, err)
	}

	// The fleet lists the live agents, the dead one only once asked.
	do(t, ctx, chromedp.Navigate(d.url+"/"))
	waitJS(t, ctx, "the live agents are listed", `document.querySelectorAll('#agents tbody tr').length === `+strconv.Itoa(len(offered)-1), 20*time.Second)
	if eval[bool](t, ctx, `!!document.querySelector('#agents tr[data-agent="`+last+`"]')`) || eval[string](t, ctx, `document.querySelector("#show-dead-count").textContent`) != "1" {
		t.Errorf("the dead agent is listed, or not counted, before the toggle")
	}
	eval[bool](t, ctx, `(() => { const c = document.querySelector("#show-dead"); c.checked = true; c.dispatchEvent(new Event("change")); return true })()`)
	waitJS(t, ctx, "the dead agent is listed last", `(() => { const rows = [...document.querySelectorAll('#agents tbody tr')]; return rows.length === `+strconv.Itoa(len(offered))+` && rows[rows.length-1].dataset.agent === "`+last+`" })()`, 10*time.Second)
}

// The fleet page tells a person an agent waits for them: it asks once to
// notify, raises a notification per new permission request, and shows a
// badge (and the title) with how many wait; each backend of a node is a
// badge, ready or not, its version on hover.
func TestDashboardTellsOfWaitingAgents(t *testing.T) {
	t.Parallel()
	d := startDash(t, web.Config{})
	ctx := browser(t)
	op, err := d.f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir(), Permission: "ask", ID: "asker"})
	if err != nil {
		t.Fatal(err)
	}
	d.fake.Script(bashReply("echo waiting"), fakemodel.Reply{Text: "Done."})
	if _, err := d.f.Send(t.Context(), schemas.SendRequest{AgentID: op.AgentID, Text: "Run it."}); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, chromedp.Navigate(d.url+"/"))
	if !eval[bool](t, ctx, `window.shoal.notifyAsked`) {
		t.Error("the page did not ask to notify")
	}
	waitJS(t, ctx, "the badge says one waits", `document.querySelector("#waiting-badge").textContent === "1 waiting" && !document.querySelector("#waiting-badge").hidden`, 60*time.Second)
	if title := eval[string](t, ctx, "document.title"); title != "(1) Shoal: fleet" {
		t.Errorf("the title: %q", title)
	}
	type note struct{ Title, Body string }
	notes := eval[[]note](t, ctx, `window.shoal.notified`)
	if len(notes) != 1 || !strings.Contains(notes[0].Title, "agent asker waits for you") || !strings.Contains(notes[0].Body, "Bash") {
		t.Errorf("the notifications: %+v", notes)
	}
	if badge := eval[string](t, ctx, `(() => { const b = document.querySelector('#nodes tr[data-node="n1"] .badge[data-backend="claude"]'); return b ? b.className + "|" + b.title : "" })()`); !strings.HasPrefix(badge, "badge ready|") || strings.HasSuffix(badge, "|") {
		t.Errorf("the claude backend's badge: %q", badge)
	}
	// A reload tells of nothing new and does not ask again.
	do(t, ctx, chromedp.Navigate(d.url+"/"))
	waitJS(t, ctx, "the badge again", `document.querySelector("#waiting-badge").textContent === "1 waiting"`, 30*time.Second)
	if eval[bool](t, ctx, `window.shoal.notifyAsked`) {
		t.Error("the page asked to notify a second time")
	}
	if n := eval[int](t, ctx, `window.shoal.notified.length`); n != 0 {
		t.Errorf("the reload notified of the same request again (%d)", n)
	}
	checkNames(t, ctx)
	screenshot(t, ctx, "fleet-waiting")
}

// An agent's page reads as a conversation: the person's turn and the
// agent's answer as messages, the answer's markdown rendered (as nodes,
// never as HTML), its thinking folded once whole, a Write shown as the
// lines it adds, a long result folded behind a button, and the agent's
// status in the header rather than in the conversation; the composer
// stays at the bottom. Screenshots at desktop and phone width.
func TestDashboardReadsAsAConversation(t *testing.T) {
	t.Parallel()
	d := startDash(t, web.Config{})
	ctx := browser(t)
	cwd := t.TempDir()
	write, _ := json.Marshal(map[string]string{"file_path": filepath.Join(cwd, "hello.txt"), "content": "hello\nworld"})
	long, _ := json.Marshal(map[string]string{"command": "seq 1 60", "description": "count"})
	d.fake.Script(
		fakemodel.Reply{Thinking: "I should write the file first.", ToolCalls: []fakemodel.ToolCall{{Name: "Write", Input: write}}},
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: long}}},
		fakemodel.Reply{Text: "Done. **Wrote** the file:\n\n- `hello.txt`\n- two lines\n\n```sh\ncat hello.txt\n```\n<script>window.pwned = 1</script>"},
	)
	op, err := d.f.Open(t.Context(), schemas.OpenRequest{CWD: cwd, Permission: "bypass", ID: "talk"})
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, chromedp.Navigate(d.url+"/agents/"+op.AgentID))
	waitJS(t, ctx, "the stream is live", `window.shoal.connects >= 1`, 20*time.Second)
	eval[bool](t, ctx, `(() => { const f = document.querySelector("#send-form"); f.elements.text.value = "Write hello.txt, then count."; f.requestSubmit(); return true })()`)
	waitJS(t, ctx, "the turn ended", `document.querySelector('[data-turn-end="1"]')`, 90*time.Second)
	waitJS(t, ctx, "the status is in the header", `document.querySelector("#agent-status").textContent === "idle"`, 30*time.Second)
	type view struct {
		Person, Bold, Code, Items int
		ThinkingOpen              bool
		Thought                   string
		Added                     []string
		FoldButton                string
		Pwned                     bool
		StatusCards               int
		ComposerLast              bool
	}
	v := eval[view](t, ctx, `(() => ({
		person: document.querySelectorAll(".msg.person").length,
		bold: [...document.querySelectorAll(".msg.agent strong")].filter(e => e.textContent === "Wrote").length,
		code: [...document.querySelectorAll(".msg.agent pre.code")].filter(e => e.textContent === "cat hello.txt").length,
		items: document.querySelectorAll(".msg.agent ul li").length,
		thinkingOpen: document.querySelector("details.thinking").open,
		thought: document.querySelector("details.thinking .thought").textContent,
		added: [...document.querySelectorAll("details.tool .diff-view .add")].map(e => e.textContent),
		foldButton: (document.querySelector("details.tool button.more") || {}).textContent || "",
		pwned: !!window.pwned,
		statusCards: [...document.querySelectorAll("#stream .end")].filter(e => e.textContent.startsWith("status")).length,
		composerLast: document.querySelector("#stream").compareDocumentPosition(document.querySelector("#send-form")) === Node.DOCUMENT_POSITION_FOLLOWING,
	}))()`)
	if v.Person != 1 || v.Bold != 1 || v.Code != 1 || v.Items != 2 || v.ThinkingOpen || v.Thought != "I should write the file first." ||
		!slices.Equal(v.Added, []string{"+ hello", "+ world"}) || v.FoldButton != "Show all 60 lines" || v.Pwned || v.StatusCards != 0 || !v.ComposerLast {
		t.Errorf("the conversation: %+v\n%s", v, eval[string](t, ctx, "document.querySelector('#stream').innerText"))
	}
	eval[bool](t, ctx, `(() => { const b = document.querySelector("details.tool button.more"); b.closest("details").open = true; b.click(); return true })()`)
	if n := eval[int](t, ctx, `Math.max(...[...document.querySelectorAll("details.tool pre")].map(p => p.textContent.split("\n").length))`); n < 60 {
		t.Errorf("the folded result, unfolded, has %d lines", n)
	}
	checkNames(t, ctx)
	screenshot(t, ctx, "conversation")
	do(t, ctx, chromedp.EmulateViewport(390, 844))
	screenshot(t, ctx, "conversation-phone")
}
