package render

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// --- event builders ----------------------------------------------------------

type step struct {
	agent string
	ev    schemas.Event
}

func on(agent string, ev schemas.Event) step { return step{agent, ev} }

func at(turn int, p schemas.Payload) schemas.Event { return schemas.Event{Turn: turn, Payload: p} }

func chunk(s string) schemas.Event {
	return at(1, schemas.AssistantText{Delta: true, Content: schemas.Text(s)})
}

func text(s string) schemas.Event {
	return at(1, schemas.AssistantText{Content: schemas.Text(s)})
}

func thinkChunk(s string) schemas.Event {
	return at(1, schemas.Thought{Delta: true, Content: schemas.Text(s)})
}

func think(s string) schemas.Event {
	return at(1, schemas.Thought{Content: schemas.Text(s)})
}

func user(s string) schemas.Event { return at(1, schemas.UserText{Content: schemas.Text(s)}) }

// announce is the first, input-less copy of a streamed tool call.
func announce(id, name string) schemas.Event {
	return at(1, schemas.ToolUse{Call: schemas.ToolCall{
		ToolCallID: id, Title: name, Kind: schemas.ToolKindForName(name), Status: schemas.ToolPending,
	}})
}

// use is the authoritative copy of a tool call, with its input.
func use(id, name, input string) schemas.Event {
	return at(1, schemas.ToolUse{Call: schemas.ToolCall{
		ToolCallID: id, Title: name, Kind: schemas.ToolKindForName(name), Status: schemas.ToolPending,
		RawInput: json.RawMessage(input),
	}})
}

func inputChunk(id, s string) schemas.Event {
	return at(1, schemas.ToolInputDelta{ToolCallID: id, PartialJSON: s})
}

func done(id string, status schemas.ToolStatus, content ...schemas.ToolCallContent) schemas.Event {
	return at(1, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: id, Status: &status, Content: content}})
}

func turn(n int) schemas.Event { return at(n, schemas.TurnStarted{}) }

func ended(n int, reason schemas.StopReason, u *schemas.Usage) schemas.Event {
	return at(n, schemas.Result{StopReason: reason, Usage: u})
}

// --- running the printer ------------------------------------------------------

func plain() Options { return Options{} }

// render feeds events of agent "a1" to a Printer and returns its output
// after Flush.
func render(t *testing.T, o Options, evs ...schemas.Event) string {
	t.Helper()
	steps := make([]step, len(evs))
	for i, ev := range evs {
		steps[i] = on("a1", ev)
	}
	return renderSteps(t, o, steps...)
}

func renderSteps(t *testing.T, o Options, steps ...step) string {
	t.Helper()
	var b strings.Builder
	p := New(&b, o)
	for i, s := range steps {
		if err := p.Event(s.agent, s.ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return b.String()
}

func expect(t *testing.T, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("output mismatch\n--- got ---\n%s--- want ---\n%s--- got (quoted) ---\n%q", got, want, got)
	}
}

// --- assistant text -------------------------------------------------------------

func TestStreamedTurnPrintsTextOnce(t *testing.T) {
	got := render(t, plain(),
		turn(1),
		user("say hello"),
		chunk("Hel"), chunk("lo, wor"), chunk("ld."),
		text("Hello, world."),
		ended(1, schemas.StopEndTurn, &schemas.Usage{InputTokens: 777, OutputTokens: 19}),
	)
	expect(t, got, ""+
		"── turn 1 ──\n"+
		"» say hello\n"+
		"Hello, world.\n"+
		"── turn 1 ended: end_turn · 777 in / 19 out ──\n")
}

func TestStreamedTextFlowsWithoutNewlinePerChunk(t *testing.T) {
	var b strings.Builder
	p := New(&b, plain())
	for _, s := range []string{"one ", "two\nthree", " four"} {
		if err := p.Event("a1", chunk(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Mid-block the line stays open: the text so far, no trailing newline.
	expect(t, b.String(), "one two\nthree four")
	if err := p.Event("a1", text("one two\nthree four")); err != nil {
		t.Fatal(err)
	}
	expect(t, b.String(), "one two\nthree four\n")
	// Nothing is left open, so Flush adds nothing.
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	expect(t, b.String(), "one two\nthree four\n")
}

func TestStreamedTextEndingInNewlineGetsNoBlankLine(t *testing.T) {
	got := render(t, plain(), chunk("Done.\n"), text("Done.\n"), ended(1, schemas.StopEndTurn, nil))
	expect(t, got, "Done.\n── turn 1 ended: end_turn ──\n")
}

func TestNonStreamedTextPrintedWhole(t *testing.T) {
	got := render(t, plain(),
		text("All tests pass.\nNothing else to do."),
		text("Second block."),
	)
	expect(t, got, "All tests pass.\nNothing else to do.\nSecond block.\n")
}

func TestDroppedChunkPrintsRemainder(t *testing.T) {
	// The last chunk never arrived: the streamed text is a prefix of the
	// authoritative copy, so only the rest is printed.
	got := render(t, plain(), chunk("The answer "), chunk("is "), text("The answer is 42."))
	expect(t, got, "The answer is 42.\n")
}

func TestDivergedStreamPrintsNoticeAndFullText(t *testing.T) {
	// A middle chunk was lost: the stream is not a prefix of the truth.
	got := render(t, plain(), chunk("The "), chunk("is 42."), text("The answer is 42."))
	expect(t, got, ""+
		"The is 42.\n"+
		"⚠ stream out of sync; full text follows\n"+
		"The answer is 42.\n")
}

func TestAuthoritativeCopyWithoutTrailingWhitespace(t *testing.T) {
	got := render(t, plain(), chunk("Hi.\n\n"), text("Hi."), text("Next."))
	expect(t, got, "Hi.\n\nNext.\n")
}

func TestTextAfterToolLineStartsFreshLine(t *testing.T) {
	got := render(t, plain(),
		chunk("Let me check"),
		announce("t1", "Bash"),
		use("t1", "Bash", `{"command":"ls"}`),
		text("Let me check."),
	)
	// The ▶ line ends the open text line; the authoritative copy then
	// supplies only the missing ".".
	expect(t, got, "Let me check\n▶ Bash  ls\n.\n")
}

// --- tool calls ---------------------------------------------------------------

func TestToolCallWithInputDeltasPrintsOneLineEach(t *testing.T) {
	got := render(t, plain(),
		announce("toolu_1", "Bash"),
		inputChunk("toolu_1", `{"comm`),
		inputChunk("toolu_1", `and":"echo`),
		inputChunk("toolu_1", ` hi"}`),
		use("toolu_1", "Bash", `{"command":"echo hi","description":"Print hi"}`),
		done("toolu_1", schemas.ToolCompleted, schemas.ToolText("hi\n")),
	)
	expect(t, got, "▶ Bash  echo hi\n↳ completed  hi\n")
	if n := strings.Count(got, "▶"); n != 1 {
		t.Errorf("%d ▶ lines, want 1", n)
	}
	if n := strings.Count(got, "↳"); n != 1 {
		t.Errorf("%d ↳ lines, want 1", n)
	}
}

func TestToolCallReplayedWithoutDeltas(t *testing.T) {
	// A log replay keeps both tool_use copies but drops the deltas.
	got := render(t, plain(),
		announce("t1", "Read"),
		use("t1", "Read", `{"file_path":"/src/main.go"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolText("package main\n\nfunc main() {}\n")),
	)
	expect(t, got, "▶ Read  /src/main.go\n↳ completed  package main  (+1 line)\n")
}

func TestAnnounceWithEmptyObjectWaitsForInput(t *testing.T) {
	// Some streams announce a call with input {} before the real input.
	first := at(1, schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "t1", Title: "Grep", RawInput: json.RawMessage(`{}`)}})
	got := render(t, plain(),
		first,
		use("t1", "Grep", `{"pattern":"func main","path":"cmd"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolText("cmd/shoal/main.go")),
	)
	expect(t, got, "▶ Grep  func main  in cmd\n↳ completed  cmd/shoal/main.go\n")
}

func TestToolWithoutArgumentsPrintedOnSecondCopy(t *testing.T) {
	got := render(t, plain(),
		announce("t1", "ExitPlanMode"),
		use("t1", "ExitPlanMode", `{}`),
		announce("t2", "Bash"),
	)
	expect(t, got, "▶ ExitPlanMode\n")
}

func TestAnnouncedCallWithoutInputPrintedAtResult(t *testing.T) {
	got := render(t, plain(),
		announce("t1", "Bash"),
		done("t1", schemas.ToolCompleted, schemas.ToolText("ok")),
		announce("t2", "Read"),
		ended(1, schemas.StopEndTurn, nil),
	)
	expect(t, got, ""+
		"▶ Bash\n"+
		"↳ completed  ok\n"+
		"▶ Read\n"+
		"── turn 1 ended: end_turn ──\n")
}

func TestFailedToolResult(t *testing.T) {
	got := render(t, plain(),
		use("t1", "Bash", `{"command":"go test ./..."}`),
		done("t1", schemas.ToolFailed, schemas.ToolText("--- FAIL: TestParse (0.00s)\n    parse_test.go:12: got 1, want 2\nFAIL\n")),
	)
	expect(t, got, "▶ Bash  go test ./...\n↳ failed  --- FAIL: TestParse (0.00s)  (+2 lines)\n")
}

func TestImageToolResult(t *testing.T) {
	png := base64.StdEncoding.EncodeToString(make([]byte, 12*1024))
	got := render(t, plain(),
		use("t1", "Read", `{"file_path":"/tmp/shot.png"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolBlock(schemas.Image(png, "image/png"))),
	)
	expect(t, got, "▶ Read  /tmp/shot.png\n↳ completed  [image image/png, 12 KiB]\n")
}

func TestDiffToolResult(t *testing.T) {
	old := "a := 1"
	got := render(t, plain(),
		use("t1", "Edit", `{"file_path":"/src/a.go","old_string":"a := 1","new_string":"a := 2"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolCallContent{Type: schemas.ToolContentDiff, Path: "/src/a.go", OldText: &old, NewText: "a := 2"}),
	)
	expect(t, got, "▶ Edit  /src/a.go\n↳ completed  edit /src/a.go\n")
}

func TestToolResultFromRawOutput(t *testing.T) {
	got := render(t, plain(),
		use("t1", "mcp__db__query", `{"sql":"select 1"}`),
		at(1, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "t1", Status: ptr(schemas.ToolCompleted), RawOutput: json.RawMessage(`"1 row"`)}}),
	)
	expect(t, got, "▶ mcp__db__query  {\"sql\":\"select 1\"}\n↳ completed  1 row\n")
}

func TestProgressUpdatesPrintNothingUntilTerminal(t *testing.T) {
	got := render(t, plain(),
		use("t1", "Bash", `{"command":"make"}`),
		at(1, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "t1", Status: ptr(schemas.ToolInProgress)}}),
		at(1, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "t1", Content: []schemas.ToolCallContent{schemas.ToolText("building…")}}}),
		done("t1", schemas.ToolCompleted),
		done("t1", schemas.ToolCompleted), // a repeat prints nothing
	)
	expect(t, got, "▶ Bash  make\n↳ completed  building…\n")
}

func TestParallelResultsNameTheirCall(t *testing.T) {
	got := render(t, plain(),
		announce("t1", "Read"),
		announce("t2", "Read"),
		use("t1", "Read", `{"file_path":"a.go"}`),
		use("t2", "Read", `{"file_path":"b.go"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolText("package a")),
		done("t2", schemas.ToolCompleted, schemas.ToolText("package b")),
	)
	expect(t, got, ""+
		"▶ Read  a.go\n"+
		"▶ Read  b.go\n"+
		"↳ completed  [Read a.go] package a\n"+
		"↳ completed  [Read b.go] package b\n")
}

func TestToolInputSummaries(t *testing.T) {
	for _, tc := range []struct{ name, input, want string }{
		{"Bash", `{"command":"cat <<EOF > x\nhello\nEOF","timeout":1000}`, "▶ Bash  cat <<EOF > x …"},
		{"Write", `{"filePath":"/a/b.txt","content":"x"}`, "▶ Write  /a/b.txt"},
		{"Glob", `{"pattern":"**/*.go"}`, "▶ Glob  **/*.go"},
		{"WebFetch", `{"url":"https://go.dev","prompt":"summarise"}`, "▶ WebFetch  https://go.dev"},
		{"WebSearch", `{"query":"nats jetstream"}`, "▶ WebSearch  nats jetstream"},
		{"Task", `{"description":"Find callers","prompt":"long…","subagent_type":"x"}`, "▶ Task  Find callers"},
		{"TodoWrite", `{"todos":[{},{},{}]}`, "▶ TodoWrite  3 todos"},
		{"shell", `{"command":["bash","-lc","ls -la"]}`, "▶ shell  bash -lc 'ls -la'"},
		{"Custom", `{"b":2,"a":[1]}`, `▶ Custom  {"b":2,"a":[1]}`},
		{"Run `ls`", `{"command":"ls"}`, "▶ Run `ls`"},
		{"", `{"x":1}`, `▶ tool  {"x":1}`},
	} {
		got := render(t, plain(), use("t", tc.name, tc.input))
		expect(t, got, tc.want+"\n")
	}
}

func TestLongSummariesTruncatedToWidth(t *testing.T) {
	long := strings.Repeat("x", 300)
	got := render(t, Options{Width: 40, Prefix: true},
		use("t1", "Bash", `{"command":"echo `+long+`"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolText(long)),
		user(long),
		text(long), // streamed text is never truncated
	)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines:\n%s", len(lines), got)
	}
	for _, l := range lines[:3] {
		if w := width(l); w > 40 {
			t.Errorf("line is %d columns wide, want ≤ 40: %q", w, l)
		}
		if !strings.HasSuffix(l, "…") {
			t.Errorf("truncated line does not end in …: %q", l)
		}
	}
	expect(t, lines[0], "[a1] ▶ Bash  echo xxxxxxxxxxxxxxxxxxxxx…")
	expect(t, lines[3], "[a1] "+long)
}

func TestControlSequencesInOutputStripped(t *testing.T) {
	got := render(t, plain(),
		use("t1", "Bash", `{"command":"ls --color"}`),
		done("t1", schemas.ToolCompleted, schemas.ToolText("\x1b[1;34mdir\x1b[0m\tfile\r\n")),
		text("bell\a and \x1b]0;title\x07 done"),
	)
	expect(t, got, "▶ Bash  ls --color\n↳ completed  dir file\nbell and ]0;title done\n")
}

// --- thoughts -------------------------------------------------------------------

func TestThoughtsHidden(t *testing.T) {
	got := render(t, plain(),
		thinkChunk("The user wants "), thinkChunk("a greeting."),
		think("The user wants a greeting."),
		chunk("Hi!"), text("Hi!"),
		think("Non-streamed reasoning."),
		text("Bye."),
	)
	expect(t, got, "💭 thinking…\nHi!\n💭 thinking…\nBye.\n")
	if strings.Contains(got, "greeting") {
		t.Error("hidden thought text was printed")
	}
}

func TestThoughtsShown(t *testing.T) {
	evs := []schemas.Event{
		thinkChunk("The user wants "), thinkChunk("a greeting."),
		chunk("Hi!"),
		think("The user wants a greeting."),
		text("Hi!"),
	}
	got := render(t, Options{ShowThoughts: true}, evs...)
	expect(t, got, "The user wants a greeting.\nHi!\n")

	colored := render(t, Options{ShowThoughts: true, Color: true}, evs...)
	expect(t, colored, "\x1b[2mThe user wants \x1b[0m\x1b[2ma greeting.\x1b[0m\nHi!\n")
}

// --- turns and usage ------------------------------------------------------------

func TestTurnSeparatorsWithUsage(t *testing.T) {
	got := render(t, Options{Width: 200},
		turn(2),
		ended(2, schemas.StopEndTurn, &schemas.Usage{InputTokens: 777, OutputTokens: 19, CacheReadTokens: 10}),
		turn(3),
		ended(3, schemas.StopMaxTokens, &schemas.Usage{InputTokens: 12345, OutputTokens: 4096, CacheReadTokens: 1000000, CacheCreationTokens: 2048, CostUSD: schemas.Cost(0.0421)}),
		turn(4),
		ended(4, schemas.StopEndTurn, &schemas.Usage{CostUSD: schemas.Cost(0)}),
		turn(5),
		ended(5, schemas.StopEndTurn, nil),
		ended(6, "", &schemas.Usage{OutputTokens: 5, CostUSD: schemas.Cost(1.5)}),
	)
	expect(t, got, ""+
		"── turn 2 ──\n"+
		"── turn 2 ended: end_turn · 777 in / 19 out · cache 10 read ──\n"+
		"── turn 3 ──\n"+
		"── turn 3 ended: ⚠ max_tokens · 12,345 in / 4,096 out · cache 1,000,000 read, 2,048 written · $0.0421 ──\n"+
		"── turn 4 ──\n"+
		"── turn 4 ended: end_turn ──\n"+
		"── turn 5 ──\n"+
		"── turn 5 ended: end_turn ──\n"+
		"── turn 6 ended · 0 in / 5 out · $1.50 ──\n")
}

func TestCancelledResultStandsOut(t *testing.T) {
	evs := []schemas.Event{
		turn(3),
		chunk("Working on i"),
		ended(3, schemas.StopCancelled, &schemas.Usage{InputTokens: 50, OutputTokens: 2}),
		ended(4, schemas.StopRefusal, nil),
	}
	expect(t, render(t, plain(), evs...), ""+
		"── turn 3 ──\n"+
		"Working on i\n"+
		"── turn 3 ended: ⚠ cancelled · 50 in / 2 out ──\n"+
		"── turn 4 ended: ⚠ refusal ──\n")

	colored := render(t, Options{Color: true}, evs...)
	if !strings.Contains(colored, "\x1b[33m── turn 3 ended:") {
		t.Errorf("cancelled turn is not yellow: %q", colored)
	}
	if !strings.Contains(colored, "\x1b[1;31m── turn 4 ended:") {
		t.Errorf("refusal is not red: %q", colored)
	}
	if !strings.Contains(colored, "\x1b[2m── turn 3 ──") {
		t.Errorf("turn separator is not dim: %q", colored)
	}
}

// --- other kinds -------------------------------------------------------------------

func TestError(t *testing.T) {
	ev := at(1, schemas.Errorf("claude exited: signal: killed"))
	expect(t, render(t, plain(), ev), "✗ error: claude exited: signal: killed\n")
	expect(t, render(t, Options{Color: true}, ev), "\x1b[1;31m✗ error: \x1b[0m\x1b[31mclaude exited: signal: killed\x1b[0m\n")
	expect(t, render(t, plain(), at(1, schemas.Errorf("panic: boom\n\ngoroutine 1\nmain.go:3"))),
		"✗ error: panic: boom\n  goroutine 1\n  main.go:3\n")
}

func TestErrorEndsOpenLine(t *testing.T) {
	got := render(t, plain(), chunk("Let me"), at(1, schemas.Errorf("stream-json parse error")))
	expect(t, got, "Let me\n✗ error: stream-json parse error\n")
}

func TestStatusLines(t *testing.T) {
	got := render(t, plain(),
		at(0, schemas.Status{Status: schemas.StatusStarting}),
		at(0, schemas.Status{Status: schemas.StatusIdle}),
		at(1, schemas.Status{Status: schemas.StatusWorking}),
		at(1, schemas.Status{Status: schemas.StatusIdle}),
		at(1, schemas.Status{Status: schemas.StatusDead}),
		at(1, schemas.Status{Status: schemas.StatusClosed}),
	)
	expect(t, got, "■ agent starting\n■ agent dead\n■ agent closed\n")
}

func TestPermission(t *testing.T) {
	got := render(t, plain(),
		announce("toolu_9", "Bash"),
		use("toolu_9", "Bash", `{"command":"rm -rf build"}`),
		at(1, schemas.Permission{
			ToolCall:  schemas.PermissionToolCall{ToolCallID: "toolu_9"},
			RequestID: "7",
			Options: []schemas.PermissionOption{
				{OptionID: "allow", Name: "Allow", Kind: schemas.PermissionAllowOnce},
				{OptionID: "always", Kind: schemas.PermissionAllowAlways},
				{OptionID: "reject", Name: "Reject", Kind: schemas.PermissionRejectOnce},
			},
		}),
		at(1, schemas.Permission{ToolCall: schemas.PermissionToolCall{ToolCallID: "toolu_x"}}),
	)
	expect(t, got, ""+
		"▶ Bash  rm -rf build\n"+
		"? permission 7 requested for toolu_9: Bash rm -rf build (options: Allow, always, Reject)\n"+
		"? permission requested for toolu_x (no options)\n")
}

func TestPlan(t *testing.T) {
	got := render(t, plain(), at(1, schemas.Plan{Entries: []schemas.PlanEntry{
		{Content: "Read the failing test", Status: schemas.PlanCompleted},
		{Content: "Fix the parser", Status: schemas.PlanInProgress, Priority: schemas.PriorityHigh},
		{Content: "Run the suite", Status: schemas.PlanPending},
	}}), at(1, schemas.Plan{Entries: []schemas.PlanEntry{{Content: "Only step"}}}))
	expect(t, got, ""+
		"plan: 3 steps\n"+
		"  ✓ Read the failing test\n"+
		"  ▸ Fix the parser\n"+
		"  ○ Run the suite\n"+
		"plan: 1 step\n"+
		"  ○ Only step\n")
}

func TestUserText(t *testing.T) {
	got := render(t, plain(),
		user("fix the bug\n\nin parse.go\nplease\nthanks\nbye"),
		at(1, schemas.UserText{Content: schemas.Image("AAAA", "image/png")}),
		at(1, schemas.UsageUpdate{Usage: schemas.Usage{InputTokens: 5}}),
	)
	expect(t, got, ""+
		"» fix the bug\n"+
		"  in parse.go\n"+
		"  please\n"+
		"  (+2 lines)\n"+
		"» [image image/png, 3 B]\n")
}

// --- several agents -----------------------------------------------------------------

func TestInterleavedAgentsWithPrefix(t *testing.T) {
	got := renderSteps(t, Options{Prefix: true},
		on("a1", turn(1)),
		on("a1", chunk("Looking at ")),
		on("b2", chunk("Running the")),
		on("a1", chunk("the code.\nIt is")),
		on("b2", chunk(" tests.")),
		on("a1", chunk(" fine.")),
		on("b2", text("Running the tests.")),
		on("a1", text("Looking at the code.\nIt is fine.")),
		on("b2", use("t1", "Bash", `{"command":"go test"}`)),
		on("a1", at(1, schemas.Errorf("boom"))),
		on("b2", done("t1", schemas.ToolCompleted, schemas.ToolText("ok"))),
		on("a1", ended(1, schemas.StopEndTurn, nil)),
	)
	expect(t, got, ""+
		"[a1] ── turn 1 ──\n"+
		"[a1] Looking at \n"+
		"[b2] Running the\n"+
		"[a1] the code.\n"+
		"[a1] It is\n"+
		"[b2]  tests.\n"+
		"[a1]  fine.\n"+
		"[b2] ▶ Bash  go test\n"+
		"[a1] ✗ error: boom\n"+
		// Another agent's line between ▶ and ↳ does not break adjacency:
		// the prefix already says whose result it is.
		"[b2] ↳ completed  ok\n"+
		"[a1] ── turn 1 ended: end_turn ──\n")
}

func TestPrefixOnBlankStreamedLines(t *testing.T) {
	got := render(t, Options{Prefix: true}, chunk("a\n\nb"), text("a\n\nb"))
	expect(t, got, "[a1] a\n[a1]\n[a1] b\n")
}

func TestInterleavedAgentsWithoutPrefixStillEndLines(t *testing.T) {
	got := renderSteps(t, plain(),
		on("a1", chunk("one")),
		on("b2", chunk("two")),
		on("a1", text("one")),
		on("b2", text("two")),
	)
	expect(t, got, "one\ntwo\n")
}

// --- colour --------------------------------------------------------------------------

// transcript has every kind of event.
func transcript() []schemas.Event {
	return []schemas.Event{
		at(0, schemas.Status{Status: schemas.StatusStarting}),
		turn(1),
		user("list files"),
		thinkChunk("Use ls."), think("Use ls."),
		chunk("Listing."), text("Listing."),
		announce("t1", "Bash"),
		inputChunk("t1", `{"command":"ls"}`),
		use("t1", "Bash", `{"command":"ls"}`),
		at(1, schemas.Permission{ToolCall: schemas.PermissionToolCall{ToolCallID: "t1"}, Options: []schemas.PermissionOption{{Name: "Allow"}}}),
		done("t1", schemas.ToolFailed, schemas.ToolText("ls: permission denied")),
		at(1, schemas.Plan{Entries: []schemas.PlanEntry{{Content: "retry", Status: schemas.PlanInProgress}}}),
		at(1, schemas.UsageUpdate{Usage: schemas.Usage{InputTokens: 10}}),
		at(1, schemas.Errorf("backend hiccup")),
		ended(1, schemas.StopCancelled, &schemas.Usage{InputTokens: 10, OutputTokens: 3}),
		at(1, schemas.Status{Status: schemas.StatusDead}),
	}
}

func TestColorOffHasNoEscapes(t *testing.T) {
	for _, o := range []Options{{}, {ShowThoughts: true}, {Prefix: true}} {
		got := render(t, o, transcript()...)
		if strings.Contains(got, "\x1b") {
			t.Errorf("plain output (%+v) has escape codes:\n%q", o, got)
		}
	}
}

func TestColorOnHasEscapes(t *testing.T) {
	got := render(t, Options{Color: true, Prefix: true, ShowThoughts: true}, transcript()...)
	for _, want := range []string{
		"\x1b[2mUse ls.\x1b[0m",              // dim thought
		"\x1b[1;36m▶ Bash\x1b[0m",            // bold tool line
		"\x1b[1;31m↳ failed  \x1b[0m",        // red failure
		"\x1b[1;31m✗ error: \x1b[0m",         // red error
		"\x1b[1;31m■ agent dead\x1b[0m",      // red death
		"\x1b[" + agentStyle("a1") + "m[a1]", // coloured prefix
	} {
		if !strings.Contains(got, want) {
			t.Errorf("coloured output lacks %q:\n%q", want, got)
		}
	}
	// Colour never reaches the next line: a line's last code is a reset.
	for l := range strings.SplitSeq(strings.TrimSuffix(got, "\n"), "\n") {
		if i := strings.LastIndex(l, "\x1b["); i >= 0 && !strings.HasPrefix(l[i:], "\x1b[0m") {
			t.Errorf("line leaves a colour on: %q", l)
		}
	}
}

// --- robustness -------------------------------------------------------------------

type oddPayload struct{ X int }

func (oddPayload) Kind() schemas.Kind { return "odd" }

type panicky struct{}

func (panicky) Kind() schemas.Kind { panic("no kind") }

// explosive panics while being encoded for the fallback line.
type explosive struct{}

func (explosive) Kind() schemas.Kind           { return "boom" }
func (explosive) MarshalJSON() ([]byte, error) { panic("kaboom") }

func TestZeroAndUnknownPayloadsNeverPanic(t *testing.T) {
	payloads := []schemas.Payload{
		nil,
		schemas.AssistantText{}, schemas.Thought{}, schemas.UserText{}, schemas.ToolUse{},
		schemas.ToolResult{}, schemas.ToolInputDelta{}, schemas.Plan{}, schemas.UsageUpdate{},
		schemas.TurnStarted{}, schemas.Result{}, schemas.Error{}, schemas.Status{}, schemas.Permission{},
		(*schemas.AssistantText)(nil), (*schemas.ToolResult)(nil),
		&schemas.AssistantText{Content: schemas.Text("via pointer")},
		schemas.AssistantText{Content: schemas.ContentBlock{Type: "video"}},
		schemas.ToolResult{Update: schemas.ToolCallUpdate{Status: ptr(schemas.ToolStatus("weird"))}},
		schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "x", Status: ptr(schemas.ToolFailed)}},
		schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "y", RawInput: json.RawMessage(`{not json`)}},
		schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "z", RawInput: json.RawMessage(`"plain"`), Content: []schemas.ToolCallContent{{Type: "mystery"}}}},
		schemas.Result{StopReason: "gave_up", Usage: &schemas.Usage{}},
		schemas.Error{Data: json.RawMessage(`{"line":"{oops"}`)},
		schemas.Status{Status: "zombie"},
		schemas.Plan{Entries: []schemas.PlanEntry{{}}},
		oddPayload{X: 7},
		panicky{},
		explosive{},
	}
	for _, o := range []Options{{}, {Color: true, Prefix: true, ShowThoughts: true, Width: 1}, {Width: -1}} {
		var evs []schemas.Event
		for _, pl := range payloads {
			evs = append(evs, at(0, pl))
		}
		got := render(t, o, evs...)
		if o == (Options{}) {
			for _, want := range []string{
				"· empty event\n",
				"via pointer\n",
				"[video]\n",
				"▶ tool\n",
				"↳ (empty tool result)\n",
				"↳ failed\n",
				"▶ tool  {not json\n",
				"▶ tool  plain\n",
				"── turn 0 ended: ⚠ gave_up ──\n",
				"── turn 0 ended ──\n",
				"✗ error\n",
				"✗ error {\"line\":\"{oops\"}\n",
				"■ agent status unknown\n",
				"■ agent zombie\n",
				"· odd {\"X\":7}\n",
				"· render.panicky {}\n",
				"· boom event (unrenderable: kaboom)\n",
				"  ○\n",
			} {
				if !strings.Contains(got, want) {
					t.Errorf("output lacks %q:\n%s", want, got)
				}
			}
		}
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(b []byte) (int, error) {
	w.n++
	return 0, errors.New("disk full")
}

func TestWriteErrorIsSticky(t *testing.T) {
	w := &failWriter{}
	p := New(w, plain())
	if err := p.Event("a1", text("hi")); err == nil || err.Error() != "disk full" {
		t.Fatalf("got %v, want disk full", err)
	}
	if err := p.Event("a1", text("again")); err == nil {
		t.Fatal("second event succeeded after a write error")
	}
	if err := p.Flush(); err == nil {
		t.Fatal("flush succeeded after a write error")
	}
	if w.n != 1 {
		t.Errorf("%d writes, want 1", w.n)
	}
}

func TestOneWritePerEvent(t *testing.T) {
	var w countWriter
	p := New(&w, plain())
	for _, ev := range transcript() {
		before := w.n
		if err := p.Event("a1", ev); err != nil {
			t.Fatal(err)
		}
		if w.n-before > 1 {
			t.Errorf("%s event made %d writes", ev.Kind(), w.n-before)
		}
	}
}

type countWriter struct{ n int }

func (w *countWriter) Write(b []byte) (int, error) { w.n++; return len(b), nil }

func TestTruncateAndWidth(t *testing.T) {
	for _, tc := range []struct {
		s    string
		max  int
		want string
	}{
		{"hello", 5, "hello"},
		{"hello world", 8, "hello w…"},
		{"hello world", 7, "hello…"},
		{"日本語テキスト", 7, "日本語…"},
		{"abc", 0, ""},
		{"abc", 1, "…"},
	} {
		if got := truncate(tc.s, tc.max); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.s, tc.max, got, tc.want)
		}
		if got := truncate(tc.s, tc.max); width(got) > tc.max && tc.max > 0 {
			t.Errorf("truncate(%q, %d) is %d wide", tc.s, tc.max, width(got))
		}
	}
	if w := width("💭 thinking…"); w != 12 {
		t.Errorf("width of marker = %d, want 12", w)
	}
}

func ptr[T any](v T) *T { return &v }

// A two-turn transcript as `shoal tail` shows it, without colour.
func ExamplePrinter() {
	status := func(s schemas.ToolStatus) *schemas.ToolStatus { return &s }
	events := []schemas.Event{
		{Turn: 1, Payload: schemas.TurnStarted{}},
		{Turn: 1, Payload: schemas.UserText{Content: schemas.Text("why does TestParse fail?")}},
		{Turn: 1, Payload: schemas.Thought{Delta: true, Content: schemas.Text("Run the test first.")}},
		{Turn: 1, Payload: schemas.Thought{Content: schemas.Text("Run the test first.")}},
		{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("Let me run ")}},
		{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("it.")}},
		{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("Let me run it.")}},
		{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "toolu_1", Title: "Bash", Kind: schemas.ToolExecute}}},
		{Turn: 1, Payload: schemas.ToolInputDelta{ToolCallID: "toolu_1", PartialJSON: `{"command":"go test -run TestParse ./parse"}`}},
		{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "toolu_1", Title: "Bash", Kind: schemas.ToolExecute,
			RawInput: json.RawMessage(`{"command":"go test -run TestParse ./parse"}`)}}},
		{Turn: 1, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "toolu_1", Status: status(schemas.ToolFailed),
			Content: []schemas.ToolCallContent{schemas.ToolText("--- FAIL: TestParse (0.00s)\n    parse_test.go:12: empty input\nFAIL")}}}},
		{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("The parser rejects empty input.")}},
		{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{InputTokens: 777, OutputTokens: 19, CacheReadTokens: 10, CostUSD: schemas.Cost(0.0123)}}},
		{Turn: 2, Payload: schemas.TurnStarted{}},
		{Turn: 2, Payload: schemas.UserText{Content: schemas.Text("fix it")}},
		{Turn: 2, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "toolu_2", Title: "Edit", Kind: schemas.ToolEdit,
			RawInput: json.RawMessage(`{"file_path":"parse/parse.go","old_string":"if s == \"\"","new_string":"if false"}`)}}},
		{Turn: 2, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "toolu_2", Status: status(schemas.ToolCompleted),
			Content: []schemas.ToolCallContent{{Type: schemas.ToolContentDiff, Path: "parse/parse.go", NewText: "if false"}}}}},
		{Turn: 2, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("Fixed")}},
		{Turn: 2, Payload: schemas.Result{StopReason: schemas.StopCancelled, Usage: &schemas.Usage{InputTokens: 1204, OutputTokens: 3}}},
		{Turn: 2, Payload: schemas.Error{Message: "claude exited: signal: interrupt"}},
		{Turn: 2, Payload: schemas.Status{Status: schemas.StatusClosed}},
	}
	p := New(os.Stdout, Options{})
	for _, ev := range events {
		p.Event("a1", ev)
	}
	p.Flush()
	// Output:
	// ── turn 1 ──
	// » why does TestParse fail?
	// 💭 thinking…
	// Let me run it.
	// ▶ Bash  go test -run TestParse ./parse
	// ↳ failed  --- FAIL: TestParse (0.00s)  (+2 lines)
	// The parser rejects empty input.
	// ── turn 1 ended: end_turn · 777 in / 19 out · cache 10 read · $0.0123 ──
	// ── turn 2 ──
	// » fix it
	// ▶ Edit  parse/parse.go
	// ↳ completed  edit parse/parse.go
	// Fixed
	// ── turn 2 ended: ⚠ cancelled · 1,204 in / 3 out ──
	// ✗ error: claude exited: signal: interrupt
	// ■ agent closed
}

func TestContentSummaries(t *testing.T) {
	line := 7
	for _, tc := range []struct {
		c    schemas.ToolCallContent
		want string
	}{
		{schemas.ToolText("  first\nsecond"), "first …"},
		{schemas.ToolBlock(schemas.ContentBlock{Type: "audio", Data: "UklGRg==", MimeType: "audio/wav"}), "[audio audio/wav, 4 B]"},
		{schemas.ToolBlock(schemas.ContentBlock{Type: "image", MimeType: "image/jpeg", URI: "file:///a.jpg"}), "[image image/jpeg, file:///a.jpg]"},
		{schemas.ToolBlock(schemas.ContentBlock{Type: "resource_link", URI: "file:///x", Name: "x.md"}), "[link x.md]"},
		{schemas.ToolBlock(schemas.ContentBlock{Type: "resource", URI: "file:///y", Text: "body"}), "body"},
		{schemas.ToolBlock(schemas.ContentBlock{Type: "resource", URI: "file:///z", Blob: "AAE="}), "[resource file:///z]"},
		{schemas.ToolCallContent{Type: "terminal", TerminalID: "term-1"}, "terminal term-1"},
		{schemas.ToolCallContent{Type: "diff", Path: "/new.go", NewText: "x"}, "edit /new.go"},
	} {
		if got := contentSummary(tc.c); got != tc.want {
			t.Errorf("contentSummary(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
	if got := formatSize(3 << 20); got != "3.0 MiB" {
		t.Errorf("formatSize = %q", got)
	}

	// An ACP-style call: no raw input, a location; its title changes later.
	title := "Read parse.go"
	got := render(t, plain(),
		at(1, schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Read", Kind: schemas.ToolRead,
			Locations: []schemas.Location{{Path: "/src/parse.go", Line: &line}}}}),
		text("meanwhile"),
		at(1, schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "c1", Title: &title, Status: ptr(schemas.ToolCompleted),
			Content: []schemas.ToolCallContent{{Type: "terminal", TerminalID: "term-1"}}}}),
	)
	expect(t, got, "▶ Read  /src/parse.go:7\nmeanwhile\n↳ completed  [Read parse.go /src/parse.go:7] terminal term-1\n")
}

// Clean keeps text, newlines and tabs, and drops escape sequences (CSI,
// OSC with either end, a lone ESC pair), C0 and C1 controls and DEL;
// CleanAll does so in every string a record holds, bytes aside.
func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"plain\ttext\nnext":                         "plain\ttext\nnext",
		"a\x1b[2Jb\x1b[31mc":                        "abc",
		"t\x1b]0;title\x07u\x1b]8;;http://x\x1b\\v": "tuv",
		"x\u009b31my\x7fz\rw\x00":                   "x31myzw",
		"é ✓ \xff":                                  "é ✓ \uFFFD",
		"a\u202eevil\u202c \u2066b\u2069":           "aevil b",
	} {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
	}
	type inner struct {
		S    string
		Raw  []byte
		Tags []string
	}
	type rec struct {
		Name   string
		Labels map[string]string
		In     *inner
		List   []inner
		hidden string
	}
	r := rec{Name: "n\x1b[2J", Labels: map[string]string{"k\x1b]0;x\x07": "v\u009b"}, In: &inner{S: "s\x07", Raw: []byte("\x1b"), Tags: []string{"t\x1b[1m"}},
		List: []inner{{S: "l\x1b[K"}}, hidden: "\x1b"}
	CleanAll(&r)
	if r.Name != "n" || r.Labels["k"] != "v" || len(r.Labels) != 1 || r.In.S != "s" || string(r.In.Raw) != "\x1b" || r.In.Tags[0] != "t" || r.List[0].S != "l" || r.hidden != "\x1b" {
		t.Errorf("CleanAll: %+v %+v", r, *r.In)
	}
}
