package tui

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/shoalfabric/shoal/schemas"
)

func ev(agent string, n uint64, p schemas.Payload) Event {
	return Event{Agent: agent, N: n, Event: schemas.Event{Turn: 1, Payload: p}}
}

// A tool call and its result are one line; streamed text is one line,
// replaced by the authoritative copy; an event had twice is taken once.
func TestFeedCoalesces(t *testing.T) {
	f := newFeed()
	done := schemas.ToolCompleted
	for i, p := range []schemas.Payload{
		schemas.TurnStarted{},
		schemas.AssistantText{Delta: true, Content: schemas.Text("Look")},
		schemas.AssistantText{Delta: true, Content: schemas.Text("ing.")},
		schemas.AssistantText{Content: schemas.Text("Looking.")},
		schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Bash", RawInput: []byte(`{"command":"ls"}`)}},
		schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Bash", RawInput: []byte(`{"command":"ls -la"}`)}},
		schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "c1", Status: &done, Content: []schemas.ToolCallContent{schemas.ToolText("a.txt\nb.txt")}}},
		schemas.Result{StopReason: schemas.StopEndTurn},
	} {
		f.add(ev("a", uint64(i+1), p), time.Now())
	}
	f.add(ev("a", 8, schemas.Result{StopReason: schemas.StopEndTurn}), time.Now())
	var got []string
	for i := range f.lines {
		got = append(got, f.text(i))
	}
	want := []string{"── turn 1 ──", "Looking.", "▶ Bash ls -la → completed: a.txt b.txt", "── turn 1 ended: end_turn ──"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("feed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The filter narrows the list; x dismisses a dead agent at once and asks
// before closing a live one; g and n switch the layout.
func TestKeys(t *testing.T) {
	m, src := newTestModel(t,
		schemas.AgentRecord{ID: "alive", Node: "n1", Status: schemas.StatusIdle, Model: "sonnet"},
		schemas.AgentRecord{ID: "gone", Node: "n2", Status: schemas.StatusDead, Model: "acp:gemini"},
	)
	screenHas(t, m, "alive", "gone", "ID", "STATUS", "TOKENS", "MODEL")
	key(m, "/")
	typeText(m, "gemini")
	key(m, "enter")
	if s := m.shown(); len(s) != 1 || s[0].ID != "gone" {
		t.Fatalf("filtered %+v", s)
	}
	key(m, "x")
	if len(m.shown()) != 0 || m.overlay != noOverlay {
		t.Fatalf("x on a dead agent: shown %d, overlay %d", len(m.shown()), m.overlay)
	}
	key(m, "/")
	key(m, "esc")
	if s := m.shown(); len(s) != 1 || s[0].ID != "alive" {
		t.Fatalf("after clearing the filter: %+v", s)
	}
	key(m, "x")
	screenHas(t, m, "Close agent alive")
	key(m, "n")
	if m.overlay != noOverlay || len(src.took()) != 0 {
		t.Fatal("any key but y keeps the agent")
	}
	key(m, "x")
	press(m, "y")
	if got := src.took(); !reflect.DeepEqual(got, []any{schemas.AgentRequest{AgentID: "alive"}}) {
		t.Fatalf("closed %v", got)
	}
	screenHas(t, m, "closed alive")
	key(m, "n")
	screenHas(t, m, "no nodes")
}

// Each action asks the fabric exactly what the person typed, and its
// outcome (or the fabric's reason) is on the status line.
func TestActionsCallTheSource(t *testing.T) {
	m, src := newTestModel(t, schemas.AgentRecord{ID: "w", Node: "n1", Status: schemas.StatusWorking, Model: "sonnet", CWD: "/work/w", Turn: 2, CreatedAt: 1})
	expect := func(what string, want ...any) {
		t.Helper()
		if got := src.took(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s asked the fabric %#v, want %#v", what, got, want)
		}
	}

	// Interrupt asks first.
	key(m, "i")
	screenHas(t, m, "Interrupt agent w's turn 2?")
	key(m, "n")
	expect("an interrupt refused")
	screenHas(t, m, "w's turn goes on")
	key(m, "i")
	press(m, "y")
	expect("an interrupt", schemas.AgentRequest{AgentID: "w"})
	screenHas(t, m, "interrupted w's turn")

	// Send: enter sends what was typed, esc sends nothing.
	key(m, "s")
	screenHas(t, m, "send a turn to w", "enter sends")
	typeText(m, "Run the tests, please.")
	press(m, "enter")
	expect("a send", schemas.SendRequest{AgentID: "w", Text: "Run the tests, please."})
	screenHas(t, m, "sent turn 3 to w")
	key(m, "s")
	typeText(m, "never mind")
	key(m, "esc")
	expect("a cancelled send")
	if m.overlay != noOverlay {
		t.Fatal("esc left the send form open")
	}

	// Set the model: the reason a switch was refused, then a switch.
	src.setModel = schemas.SetModelReply{Reason: "claude CLI agents cannot switch models in place"}
	key(m, "m")
	screenHas(t, m, "set the model of w", "sonnet")
	key(m, "ctrl+u")
	typeText(m, "opus")
	press(m, "enter")
	expect("a set_model", schemas.SetModelRequest{AgentID: "w", Model: "opus"})
	screenHas(t, m, "w did not switch: claude CLI agents cannot switch models in place")
	src.setModel = schemas.SetModelReply{Switched: true}
	key(m, "m")
	key(m, "ctrl+u")
	typeText(m, "haiku")
	press(m, "enter")
	expect("a second set_model", schemas.SetModelRequest{AgentID: "w", Model: "haiku"})
	screenHas(t, m, "w switched to haiku")

	// Open: three fields that start as the selected agent's; the new
	// agent takes the cursor once it is listed.
	key(m, "o")
	screenHas(t, m, "open an agent", "/work/w", "sonnet", "default")
	key(m, "ctrl+u")
	typeText(m, "/work/other")
	key(m, "tab")
	key(m, "ctrl+u")
	typeText(m, "acp:opencode")
	key(m, "tab")
	key(m, "ctrl+u")
	typeText(m, "lab")
	press(m, "enter")
	expect("an open", schemas.OpenRequest{CWD: "/work/other", Model: "acp:opencode", Permission: "lab"})
	screenHas(t, m, "opened fresh on n1")
	m.Update(agentsMsg{
		{ID: "w", Node: "n1", Status: schemas.StatusWorking, CreatedAt: 1},
		{ID: "fresh", Node: "n1", Status: schemas.StatusStarting, CreatedAt: 2},
	})
	if a, _ := m.selected(); a.ID != "fresh" {
		t.Fatalf("after the open the cursor is on %s", a.ID)
	}

	// A dead agent takes no turn.
	m.Update(agentsMsg{{ID: "w", Node: "n1", Status: schemas.StatusDead, CreatedAt: 1}})
	key(m, "s")
	expect("a send to a dead agent")
	screenHas(t, m, "w is dead")
}

func permitRecord(id string) schemas.PermitRecord {
	return schemas.PermitRecord{
		AgentID: "w", RequestID: id, Node: "n1", Tool: "Bash", ToolCallID: "toolu_1",
		Input:       []byte(`{"command":"rm -rf build","description":"Clean the build"}`),
		Description: "Clean the build directory",
		Options: []schemas.PermissionOption{
			{OptionID: "allow", Name: "Allow once", Kind: schemas.PermissionAllowOnce},
			{OptionID: "always", Name: "Always allow", Kind: schemas.PermissionAllowAlways},
			{OptionID: "reject", Name: "Reject", Kind: schemas.PermissionRejectOnce},
		},
		AskedAt: float64(time.Now().Unix()),
	}
}

// An agent's open permission requests are marked in the list; p shows
// one in full, input pretty-printed, and answers it: allow, deny with a
// message, or one of the agent's options.
func TestPermissionRequests(t *testing.T) {
	m, src := newTestModel(t,
		schemas.AgentRecord{ID: "w", Node: "n1", Status: schemas.StatusWorking, CreatedAt: 1},
		schemas.AgentRecord{ID: "v", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 2},
	)
	answer := func(keys ...string) schemas.PermitRequest {
		t.Helper()
		src.pending = []schemas.PermitRecord{permitRecord("r1")}
		m.Update(pendingMsg{PendingReply: schemas.PendingReply{Requests: src.pending}, once: true})
		screenHas(t, m, "⚠ 1 waiting")
		key(m, "p")
		screenHas(t, m, "permission request: Bash", "Clean the build directory", `"command": "rm -rf build"`,
			`"description": "Clean the build"`, "1  Allow once", "2  Always allow", "3  Reject", "a allow · d deny")
		src.pending = nil
		for _, k := range keys[:len(keys)-1] {
			key(m, k)
		}
		press(m, keys[len(keys)-1])
		got := src.took()
		if len(got) != 1 {
			t.Fatalf("%v asked the fabric %v", keys, got)
		}
		if v := m.View().Content; strings.Contains(v, "⚠ 1 waiting") {
			t.Fatalf("the answered request is still marked:\n%s", v)
		}
		return got[0].(schemas.PermitRequest)
	}
	base := schemas.PermitRequest{AgentID: "w", RequestID: "r1", By: "tui"}
	for _, c := range []struct {
		keys []string
		want func(schemas.PermitRequest) schemas.PermitRequest
	}{
		{[]string{"a"}, func(r schemas.PermitRequest) schemas.PermitRequest { r.Decision = schemas.DecisionAllow; return r }},
		{append(append([]string{"d"}, strings.Split("not on main", "")...), "enter"), func(r schemas.PermitRequest) schemas.PermitRequest {
			r.Decision, r.Message = schemas.DecisionDeny, "not on main"
			return r
		}},
		{[]string{"2"}, func(r schemas.PermitRequest) schemas.PermitRequest {
			r.Decision, r.Option = schemas.DecisionAllow, "always"
			return r
		}},
		{[]string{"3"}, func(r schemas.PermitRequest) schemas.PermitRequest {
			r.Decision, r.Option = schemas.DecisionDeny, "reject"
			return r
		}},
	} {
		if got, want := answer(c.keys...), c.want(base); !reflect.DeepEqual(got, want) {
			t.Errorf("%v answered %+v, want %+v", c.keys, got, want)
		}
	}

	// Another agent has none.
	src.pending = []schemas.PermitRecord{permitRecord("r1")}
	m.Update(pendingMsg{PendingReply: schemas.PendingReply{Requests: src.pending}, once: true})
	key(m, "down")
	key(m, "p")
	screenHas(t, m, "no permission request waiting for v")
	if src.took() != nil {
		t.Fatal("p without a request asked the fabric")
	}

	// More wait than the fabric's reply could list: the header counts
	// those it left out.
	m.Update(pendingMsg{PendingReply: schemas.PendingReply{Requests: src.pending, Omitted: 3}, once: true})
	screenHas(t, m, "⚠ 1 waiting, 3 more not listed")

	// A fabric that serves none: no marker, and p says so.
	m.Update(pendingMsg{err: fmt.Errorf("reading: %w", ErrNoPermits)})
	key(m, "up")
	if v := m.View().Content; strings.Contains(v, "⚠") {
		t.Fatalf("a marker without permission requests:\n%s", v)
	}
	key(m, "p")
	screenHas(t, m, "unavailable: this fabric does not serve permission requests")
}

// The transcript wraps a long line to the width, every word kept, and a
// tool's entry expands on enter to its whole result.
func TestTranscriptWrapsAndExpands(t *testing.T) {
	m, src := newTestModel(t, schemas.AgentRecord{ID: "w", Node: "n1", Status: schemas.StatusIdle})
	m.Update(tea.WindowSizeMsg{Width: 40, Height: 20})
	var words []string
	for i := range 60 {
		words = append(words, fmt.Sprintf("word%02d", i))
	}
	long := strings.Join(words, " ")
	done := schemas.ToolCompleted
	src.stored["w"] = []Event{
		ev("w", 1, schemas.UserText{Content: schemas.Text("Say a lot.")}),
		ev("w", 2, schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Bash", RawInput: []byte(`{"command":"ls"}`)}}),
		ev("w", 3, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "c1", Status: &done, Content: []schemas.ToolCallContent{schemas.ToolText("first.txt\nsecond.txt\nthird.txt")}}}),
		ev("w", 4, schemas.AssistantText{Content: schemas.Text(long)}),
	}
	press(m, "t")
	v := m.View().Content
	var text []string
	for _, l := range strings.Split(v, "\n") {
		if w := len([]rune(stripANSI(l))); w > 40 {
			t.Fatalf("a line of %d cells on a screen of 40: %q", w, l)
		}
		r := []rune(stripANSI(l))
		if body := strings.TrimSpace(string(r[min(len(r), gutter):])); strings.HasPrefix(body, "word") {
			text = append(text, body)
		}
	}
	if strings.Join(text, " ") != long {
		t.Fatalf("the wrapped answer reads\n%s\nnot\n%s\nscreen:\n%s", strings.Join(text, " "), long, v)
	}
	if len(text) < 8 {
		t.Fatalf("the answer took %d lines at width 40", len(text))
	}
	if strings.Contains(v, "second.txt") {
		t.Fatal("a folded tool shows its whole result")
	}
	key(m, "up") // up within the long answer, then to the tool
	for i := 0; i < 20 && m.tr.sel != 1; i++ {
		key(m, "up")
	}
	if m.tr.sel != 1 {
		t.Fatalf("up never reached the tool: on entry %d", m.tr.sel)
	}
	key(m, "enter")
	screenHas(t, m, "▶ Bash ls → completed: first.txt", "second.txt", "third.txt", `"command": "ls"`)
	key(m, "enter")
	if strings.Contains(m.View().Content, "third.txt") {
		t.Fatal("enter does not fold the tool again")
	}
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b {
			for i < len(s) && !(s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z') {
				i++
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// The list keeps its order while agents change status and new ones come,
// and the cursor stays on its agent; when that agent goes, it stays on
// the row.
func TestCursorStaysOnItsAgent(t *testing.T) {
	rec := func(id string, created float64, st schemas.AgentStatus) schemas.AgentRecord {
		return schemas.AgentRecord{ID: id, Node: "n1", Status: st, CreatedAt: created}
	}
	m, _ := newTestModel(t, rec("a", 1, schemas.StatusIdle), rec("b", 2, schemas.StatusIdle), rec("c", 3, schemas.StatusIdle))
	key(m, "down")
	if a, _ := m.selected(); a.ID != "b" {
		t.Fatalf("selected %s", a.ID)
	}
	order := func() string {
		var ids []string
		for _, a := range m.shown() {
			ids = append(ids, a.ID)
		}
		return strings.Join(ids, " ")
	}
	m.Update(agentsMsg{rec("c", 3, schemas.StatusWorking), rec("a", 1, schemas.StatusDead), rec("b", 2, schemas.StatusWorking), rec("d", 4, schemas.StatusStarting)})
	if a, _ := m.selected(); a.ID != "b" || order() != "a b c d" {
		t.Fatalf("after a refresh: on %s, order %s", a.ID, order())
	}
	m.Update(eventsMsg{{ev: ev("a", 1, schemas.TurnStarted{}), at: time.Now()}})
	m.Update(agentsMsg{rec("0", 0.5, schemas.StatusIdle), rec("a", 1, schemas.StatusWorking), rec("b", 2, schemas.StatusIdle), rec("c", 3, schemas.StatusIdle)})
	if a, _ := m.selected(); a.ID != "b" || order() != "0 a b c" {
		t.Fatalf("after an agent came before it: on %s, order %s", a.ID, order())
	}
	row := m.sel
	m.Update(agentsMsg{rec("0", 0.5, schemas.StatusIdle), rec("a", 1, schemas.StatusWorking), rec("c", 3, schemas.StatusIdle)})
	if a, _ := m.selected(); a.ID != "c" || m.sel != row {
		t.Fatalf("after its agent went: on %s at row %d, was row %d", a.ID, m.sel, row)
	}
}

// The feed and the transcript read one way: oldest at the top, newest at
// the bottom. Both follow new events at the bottom, and neither moves
// once the user has scrolled up, until End.
func TestReadingDirection(t *testing.T) {
	m, src := newTestModel(t, schemas.AgentRecord{ID: "w", Node: "n1", Status: schemas.StatusWorking})
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 14}) // 12 body rows: 7 feed lines
	n := uint64(0)
	say := func(count int) {
		var batch eventsMsg
		for range count {
			n++
			batch = append(batch, incoming{ev: ev("w", n, schemas.AssistantText{Content: schemas.Text(fmt.Sprintf("line-%03d", n))}), at: time.Now()})
		}
		m.Update(batch)
	}
	shownLines := func(v string) []string {
		var out []string
		for _, l := range strings.Split(stripANSI(v), "\n") {
			if i := strings.Index(l, "line-"); i >= 0 {
				out = append(out, l[i:i+8])
			}
		}
		return out
	}
	say(20)
	got := shownLines(m.View().Content)
	if len(got) != m.feedRows() || got[0] != "line-014" || got[len(got)-1] != "line-020" {
		t.Fatalf("the feed shows %v, want line-014 to line-020, newest last", got)
	}
	say(1)
	if got := shownLines(m.View().Content); got[len(got)-1] != "line-021" {
		t.Fatalf("the feed did not follow: %v", got)
	}
	key(m, "tab")
	for range 10 {
		key(m, "up")
	}
	before := shownLines(m.View().Content)
	say(5)
	if after := shownLines(m.View().Content); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Fatalf("the scrolled feed moved from %v to %v", before, after)
	}
	key(m, "end")
	if got := shownLines(m.View().Content); got[len(got)-1] != "line-026" {
		t.Fatalf("End does not go back to the newest: %v", got)
	}

	// The transcript: the same direction, the same following.
	for i := uint64(1); i <= n; i++ {
		src.stored["w"] = append(src.stored["w"], ev("w", i, schemas.AssistantText{Content: schemas.Text(fmt.Sprintf("line-%03d", i))}))
	}
	press(m, "t")
	got = shownLines(m.View().Content)
	if len(got) != m.bodyHeight() || got[0] != "line-015" || got[len(got)-1] != "line-026" {
		t.Fatalf("the transcript shows %v, want line-015 to line-026, newest last", got)
	}
	say(2)
	if got := shownLines(m.View().Content); got[len(got)-1] != "line-028" {
		t.Fatalf("the transcript did not follow: %v", got)
	}
	key(m, "pgup")
	before = shownLines(m.View().Content)
	say(3)
	if after := shownLines(m.View().Content); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Fatalf("the scrolled transcript moved from %v to %v", before, after)
	}
	key(m, "end")
	if got := shownLines(m.View().Content); got[len(got)-1] != "line-031" {
		t.Fatalf("End does not go back to the newest: %v", got)
	}
}

// A working agent pulses, and turns amber when it has been silent for
// longer than Options.Silent.
func TestSilentAgentTurnsAmber(t *testing.T) {
	m, _ := newTestModel(t, schemas.AgentRecord{ID: "busy", Node: "n1", Status: schemas.StatusWorking})
	m.Update(eventsMsg{{ev: ev("busy", 1, schemas.TurnStarted{}), at: time.Now()}})
	a := m.shown()[0]
	m.Update(tickMsg(time.Now()))
	first := m.color(a)
	m.Update(tickMsg(time.Now()))
	if second := m.color(a); first == second {
		t.Fatalf("a working agent does not pulse: %v %v", first, second)
	}
	m.Update(tickMsg(time.Now().Add(time.Minute)))
	if c := m.color(a); c != amber {
		t.Fatalf("a silent agent is %v, want amber", c)
	}
}

// A click on a row selects that agent.
func TestMouseSelects(t *testing.T) {
	m, _ := newTestModel(t,
		schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 1},
		schemas.AgentRecord{ID: "a2", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 2},
	)
	m.View()
	// Row 0 is the title, row 1 the column headers, row 2 node n1, rows
	// 3 and 4 the agents.
	m.Update(tea.MouseClickMsg{X: 3, Y: 4, Button: tea.MouseLeft})
	if a, _ := m.selected(); a.ID != "a2" {
		t.Fatalf("selected %s", a.ID)
	}
}

// The nodes view: labels, agents against the limit, load, working
// agents, heartbeat age, and why a backend cannot run.
func TestNodesView(t *testing.T) {
	m, _ := newTestModel(t, schemas.AgentRecord{ID: "w", Node: "alpha", Status: schemas.StatusWorking})
	now := time.Now()
	m.Update(tickMsg(now))
	m.Update(nodesMsg{
		{Name: "alpha", Labels: map[string]string{"gpu": "yes", "site": "lab"}, Agents: 1, MaxAgents: 4, Heartbeat: float64(now.Add(-3*time.Second).UnixNano()) / 1e9,
			Backends: []schemas.BackendInfo{{Kind: "claude", Ready: true}, {Kind: "acp", Agent: "gemini", Problem: "gemini is not installed"}}},
		{Name: "beta", Agents: 0, Heartbeat: float64(now.UnixNano()) / 1e9, Backends: []schemas.BackendInfo{{Kind: "ollama", Ready: true, Models: []string{"qwen3", "llama3"}}}},
	})
	key(m, "n")
	v := screenHas(t, m, "NODE", "AGENTS", "LOAD", "WORKING", "SEEN", "LABELS", "gpu=yes,site=lab", "1/4", "25%", "3s", "claude acp:gemini✖", "✖ acp:gemini: gemini is not installed", "ollama(2 models)")
	for _, l := range strings.Split(v, "\n") {
		if strings.HasPrefix(l, "alpha") && !strings.Contains(l, " 1 ") {
			t.Errorf("alpha's working count: %q", l)
		}
	}
}

// differSource counts changed files as told.
type differSource struct {
	*fakeSource
	files map[string]int
	asked []string
}

func (d *differSource) Changed(_ context.Context, agent string) (int, error) {
	d.asked = append(d.asked, agent)
	return d.files[agent], nil
}

// The selected agent on a repository shows its repository, branch and
// how many files it changed; an agent on a plain directory shows its
// directory and is never counted.
func TestChangedFilesOfTheSelectedAgent(t *testing.T) {
	ws := &schemas.Workspace{Source: "/home/me/app", Branch: "shoal/r1", Base: strings.Repeat("ab", 20)}
	agents := []schemas.AgentRecord{
		{ID: "r1", Status: schemas.StatusIdle, Node: "n1", CWD: "/node/work/r1", Workspace: ws, CreatedAt: 1},
		{ID: "d1", Status: schemas.StatusIdle, Node: "n1", CWD: "/srv/d1", CreatedAt: 2},
	}
	src := &differSource{fakeSource: &fakeSource{agents: agents, stored: map[string][]Event{}}, files: map[string]int{"r1": 3}}
	m := New(t.Context(), src, Options{Dir: "/home/me"})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 30})
	// count moves to agent id as a poll of the agents does, and takes
	// the count that poll asks for, if it asks.
	count := func(id string) {
		m.keep = id
		_, cmd := m.Update(agentsMsg(agents))
		batch, _ := cmd().(tea.BatchMsg)
		got := make(chan tea.Msg, len(batch))
		for _, c := range batch {
			if c != nil {
				go func() { got <- c() }()
			}
		}
		for {
			select {
			case msg := <-got:
				if c, ok := msg.(changedMsg); ok {
					m.Update(c)
					return
				}
			case <-time.After(time.Second):
				return // the poll asked for no count
			}
		}
	}
	count("r1")
	if view := m.View().Content; !strings.Contains(view, "repo /home/me/app on shoal/r1 from abababababab  3 files changed") {
		t.Errorf("the selected agent on a repository:\n%s", view)
	}
	count("r1") // counted a moment ago: not again
	count("d1")
	if view := m.View().Content; !strings.Contains(view, "cwd /srv/d1") {
		t.Errorf("the selected agent on a directory:\n%s", view)
	}
	if strings.Join(src.asked, ",") != "r1" {
		t.Errorf("counted the changes of %v, want r1 once", src.asked)
	}
}

// awaySource is a fabric whose coordinator does not answer.
type awaySource struct{ *fakeSource }

func (awaySource) Agents(context.Context) ([]schemas.AgentRecord, error) {
	return nil, fmt.Errorf("list agents: %w", context.DeadlineExceeded)
}
func (awaySource) Nodes(context.Context) ([]schemas.NodeRecord, error) {
	return nil, fmt.Errorf("list nodes: %w", context.DeadlineExceeded)
}

// While the coordinator is away the monitor says it is reconnecting (not
// a raw deadline), and it goes on reading the nodes as well as the
// agents, so neither view freezes once it is back.
func TestTUIWhileTheCoordinatorIsAway(t *testing.T) {
	src := awaySource{&fakeSource{stored: map[string][]Event{}}}
	m := New(t.Context(), src, Options{Dir: "/home/me", Poll: time.Millisecond})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 30})
	msg := m.readAgents(0)()
	_, again := m.Update(msg)
	if again == nil {
		t.Error("a failed read of the agents is not tried again")
	}
	if view := m.View().Content; !strings.Contains(view, "reconnecting… (the coordinator does not answer: context deadline exceeded)") {
		t.Errorf("while away:\n%s", view)
	}
	nmsg := m.readNodes(0)()
	if _, again := m.Update(nmsg); again == nil {
		t.Error("a failed read of the nodes is not tried again: the nodes view would freeze")
	}
}

// An observer's monitor offers no action: its key line says it watches,
// and an action key says so at once, asking nothing of the fabric.
func TestTUIObserverIsOfferedNoActions(t *testing.T) {
	agents := []schemas.AgentRecord{{ID: "a1", Status: schemas.StatusIdle, Node: "n1", CWD: "/w", CreatedAt: 1}}
	src := &fakeSource{agents: agents, stored: map[string][]Event{}}
	m := New(t.Context(), src, Options{Dir: "/home/me", Observer: true})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 30})
	m.Update(agentsMsg(agents))
	if view := m.View().Content; !strings.Contains(view, "watching only") || strings.Contains(view, "s send") {
		t.Errorf("an observer's key line:\n%s", view)
	}
	for _, k := range []string{"s", "i", "x", "m", "p", "o"} {
		key(m, k)
		if m.overlay != noOverlay || m.form != nil || m.confirm != nil || !strings.Contains(m.status, "this monitor only watches") {
			t.Errorf("key %s: overlay %v, form %v, confirm %v, status %q", k, m.overlay, m.form != nil, m.confirm != nil, m.status)
		}
		m.status = ""
	}
	if calls := src.took(); len(calls) != 0 {
		t.Errorf("an observer's keys asked the fabric: %v", calls)
	}
}

// A permission request's line names it by the id p and shoal permit
// take, with the tool and what it is about; its answer is a line of its
// own saying who answered how, not a copy of the request.
func TestFeedNamesPermissionRequests(t *testing.T) {
	f := newFeed()
	req := schemas.Permission{ToolCall: schemas.PermissionToolCall{ToolCallID: "toolu_1"}, RequestID: "perm-1a2b", Tool: "Bash",
		Input: []byte(`{"command":"rm -rf build \u0026\u0026 ls"}`)}
	f.add(ev("a", 1, req), time.Now())
	ans := req
	ans.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionDeny, By: "cli", Message: "not now"}
	f.add(ev("a", 2, ans), time.Now())
	var got []string
	for i := range f.lines {
		got = append(got, f.text(i))
	}
	want := []string{"? perm-1a2b asks: Bash rm -rf build && ls", "✗ perm-1a2b denied by cli: not now"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("feed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// spenderSource is a fabric that says what the fleet spent.
type spenderSource struct {
	*fakeSource
	rep schemas.BudgetsReply
}

func (s spenderSource) Budgets(context.Context) (schemas.BudgetsReply, error) { return s.rep, nil }

// The header shows what the fleet spent against its budget, in tokens
// (it said "spent 60" with no unit), and says so once the budget is
// reached; each agent's row its own tokens.
func TestHeaderShowsTheFleetsSpend(t *testing.T) {
	agents := []schemas.AgentRecord{{ID: "a1", Status: schemas.StatusIdle, Node: "n1", CreatedAt: 1, Usage: schemas.Usage{InputTokens: 1500, OutputTokens: 200}}}
	used := schemas.Usage{InputTokens: 30_000, OutputTokens: 2_000, CostUSD: schemas.Cost(1.25)}
	src := spenderSource{fakeSource: &fakeSource{agents: agents, stored: map[string][]Event{}}, rep: schemas.BudgetsReply{
		Budgets: []schemas.BudgetLine{{Fleet: true, Budget: schemas.Budget{Tokens: 50_000}, Used: used}},
		Spent:   schemas.Spent{Seq: 9, Rows: []schemas.SpentRow{{Node: "n1", Model: "sonnet", Turns: 4, Usage: used}}},
	}}
	m := New(t.Context(), src, Options{})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 20})
	m.Update(agentsMsg(agents))
	m.Update(m.readSpend(0)())
	view := m.View().Content
	if !strings.Contains(view, "spent 32.0k of 50.0k tokens, $1.25") || strings.Contains(view, "budget reached") || !strings.Contains(view, "1.7k") {
		t.Errorf("the fleet within its budget:\n%s", view)
	}
	src.rep.Budgets[0].Budget.Tokens = 30_000
	m.src = src
	m.Update(m.readSpend(0)())
	if view := m.View().Content; !strings.Contains(view, "spent 32.0k of 30.0k tokens, $1.25 ⚠ fleet budget reached") {
		t.Errorf("the fleet past its budget:\n%s", view)
	}
	// Cents round a small spend to nothing ("$0.00 of $1.00").
	src.rep.Budgets[0].Budget = schemas.Budget{USD: 1}
	src.rep.Spent.Rows[0].Usage.CostUSD = schemas.Cost(0.0037)
	m.src = src
	m.Update(m.readSpend(0)())
	if view := m.View().Content; !strings.Contains(view, "tokens, $0.0037 of $1.00") {
		t.Errorf("the fleet's small spend against a dollar budget:\n%s", view)
	}
}

// evil is text a model, an agent or a node might write to take over the
// terminal that shows it: retitle the window, plant a link, clear the
// screen, an 8-bit CSI, and a clipboard write.
const evil = "plain \x1b]0;TITLEPWN\x1b\\ \x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\ \x1b[2J\u009b31m \x1b]52;c;cHduZWQ=\x07 end"

// noEscapes fails if what the screen shows carries evil's sequences (the
// TUI's own styling, CSI … m, is its own).
func noEscapes(t *testing.T, where, v string) {
	t.Helper()
	for _, bad := range []string{"\x1b]", "\x1b[2J", "\u009b", "\x07"} {
		if strings.Contains(v, bad) {
			t.Errorf("the %s shows %q of what an agent wrote:\n%q", where, bad, v)
		}
	}
}

// Nothing agents, models or nodes write reaches the terminal as escape
// sequences: not in the list (a model an agent's child was opened with),
// the feed and the transcript (a model's text, a tool's output), the
// nodes (labels) or a permission request (its tool and input).
func TestNothingAnAgentWritesReachesTheTerminal(t *testing.T) {
	m, src := newTestModel(t, schemas.AgentRecord{ID: "w", Node: "n1", Status: schemas.StatusIdle, Model: "sonnet" + evil, CWD: "/work" + evil})
	done := schemas.ToolCompleted
	evs := []Event{
		ev("w", 1, schemas.AssistantText{Content: schemas.Text(evil)}),
		ev("w", 2, schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Bash" + evil, RawInput: []byte(`{"command":"ls \u009b2J"}`)}}),
		ev("w", 3, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "c1", Status: &done, Content: []schemas.ToolCallContent{schemas.ToolText(evil)}}}),
	}
	var in eventsMsg
	for _, e := range evs {
		in = append(in, incoming{ev: e, at: time.Now()})
	}
	m.Update(in)
	v := screenHas(t, m, "plain", "end")
	noEscapes(t, "list and feed", v)

	src.stored["w"] = evs
	press(m, "t")
	noEscapes(t, "transcript", screenHas(t, m, "plain"))
	press(m, "esc")

	now := time.Now()
	m.Update(nodesMsg{{Name: "n1", Labels: map[string]string{"site" + evil: "lab" + evil}, Heartbeat: float64(now.UnixNano()) / 1e9,
		Backends: []schemas.BackendInfo{{Kind: "claude", Ready: true, Version: "2" + evil}}}})
	key(m, "n")
	noEscapes(t, "nodes", m.View().Content)
	key(m, "n")

	p := permitRecord("r1")
	p.Tool, p.Description, p.Input = "Bash"+evil, "Clean"+evil, []byte(`{"command":"rm \u009b2J \u001b]0;TITLEPWN\u0007"}`)
	m.Update(pendingMsg{PendingReply: schemas.PendingReply{Requests: []schemas.PermitRecord{p}}, once: true})
	key(m, "p")
	noEscapes(t, "permission request", screenHas(t, m, "permission request"))
}

// A request's tool and description are what an agent says (gemini names a
// shell call by its command): their lines after the first are indented
// under the first, so none reads as a line of the overlay's own.
func TestPermitOverlayKeepsAnAgentsLinesUnderTheirLabel(t *testing.T) {
	m, _ := newTestModel(t)
	tool := "rm -rf ~/victim\n\ninput\n  {\"file_path\": \"README.md\"}\n\noptions\n  1  Allow"
	lines := m.permitLines(schemas.PermitRecord{AgentID: "a", RequestID: "perm-1", Tool: tool, Description: "one\ninput"}, 0, 1)
	var labels []string
	var shown []string
	for _, l := range lines {
		shown = append(shown, wrapText(l, 200)...) // as the overlay lays them out
	}
	for _, l := range shown {
		if l != "" && !strings.HasPrefix(l, " ") {
			labels = append(labels, strings.Fields(l)[0])
		}
	}
	lines = shown
	if want := []string{"request", "tool", "asked", "description", "input", "options"}; !reflect.DeepEqual(labels, want) {
		t.Errorf("the overlay's lines begin %q, want %q:\n%s", labels, want, strings.Join(lines, "\n"))
	}
}
