package acp

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	const (
		deny       = "denied by policy"
		notAllowed = "not in this agent's allowlist"
		notebook   = "the notebook preset has no shell or file tools: use Shoal's tools (mcp__shoal__*), or open the agent with another preset for file access"
		specialist = "a specialist with no allowlist may call nothing"
		auto       = "the auto preset cannot consult a classifier over ACP"
	)
	none := []string{}
	list := func(xs ...string) *[]string { return &xs }
	type call struct {
		tool string
		why  string // "" means allowed
	}
	tests := []struct {
		name    string
		preset  string
		allowed []string
		deny    *[]string // nil is the recursion guard
		calls   []call
	}{
		{name: "default with the guard", preset: "default", calls: []call{
			{"Bash", ""},
			{"Read", ""},
			{"fs/write_text_file", ""},
			{"mcp__shoal__agent_open", deny},
			{"MCP__Shoal__Agent_Open", deny},
			{"shoal_agent_open", deny},     // opencode's spelling
			{"Shoal_Agent_Run", deny},      // in any case
			{"agent_open", deny},           // a qualified entry matches the unqualified name
			{"mcp__other__agent_open", ""}, // but not another server's tool
			{"mcp__shoal__agent_output", ""},
			{"shoal_agent_output", ""},
			{"Task", deny},
			{"task", deny},
			{"Workflow", deny},
			{"Skill", ""},
		}},
		{name: "default, guard lifted", preset: "", deny: &none, calls: []call{
			{"mcp__shoal__agent_open", ""},
			{"shoal_agent_open", ""},
			{"Task", ""},
		}},
		{name: "server entry matches only qualified names", preset: "default", deny: list("mcp__shoal"), calls: []call{
			{"mcp__shoal__agent_nodes", deny},
			{"shoal_agent_output", deny},
			{"agent_nodes", ""},
			{"mcp__other__agent_nodes", ""},
			{"Bash", ""},
		}},
		{name: "bare entry matches every server", preset: "default", deny: list("Agent_Output"), calls: []call{
			{"agent_output", deny},
			{"mcp__shoal__agent_output", deny},
			{"shoal_agent_output", deny},
			{"mcp__other__agent_output", deny},
			{"agent_nodes", ""},
		}},
		{name: "opencode spelling as an entry", preset: "default", deny: list("shoal_agent_nodes"), calls: []call{
			{"mcp__shoal__agent_nodes", deny},
			{"agent_nodes", deny},
			{"mcp__other__agent_nodes", ""},
		}},
		{name: "deny patterns", preset: "default", deny: list("Bash(rm *)", "mcp__shoal__agent_*", "web*"), calls: []call{
			{"Bash", deny},
			{"shoal_agent_nodes", deny},
			{"mcp__shoal__agent_output", deny},
			{"agent_nodes", ""},
			{"mcp__other__agent_nodes", ""},
			{"WebFetch", deny},
			{"mcp__search__websearch", deny},
			{"Read", ""},
		}},
		{name: "default with an allowlist is only those", preset: "default", allowed: []string{"Read", "mcp__shoal"}, calls: []call{
			{"read", ""},
			{"shoal_agent_output", ""},
			{"mcp__shoal__agent_nodes", ""},
			{"Bash", notAllowed},
			{"mcp__other__x", notAllowed},
			{"mcp__shoal__agent_open", deny}, // deny before the allowlist
		}},
		{name: "an allow pattern allows nothing", preset: "default", allowed: []string{"Bash(git *)"}, calls: []call{
			{"Bash", notAllowed},
		}},
		{name: "notebook", preset: "notebook", calls: []call{
			{"Read", deny},
			{"bash", deny},
			{"NotebookEdit", deny},
			{"mcp__shoal__agent_output", ""},
			{"shoal_agent_nodes", ""},
			{"mcp__shoal__agent_open", deny},
			{"fs/read_text_file", notebook},
			{"fs/write_text_file", notebook},
			{"WebFetch", notebook},
			{"mcp__other__tool", notebook},
		}},
		{name: "specialist without an allowlist", preset: "specialist", calls: []call{
			{"mcp__shoal__agent_output", specialist},
			{"WebFetch", specialist},
			{"Read", deny},
		}},
		{name: "specialist with an allowlist", preset: "specialist", allowed: []string{"mcp__shoal__agent_output", "WebFetch", "Read"}, calls: []call{
			{"shoal_agent_output", ""},
			{"webfetch", ""},
			{"mcp__shoal__agent_nodes", notAllowed},
			{"Read", deny}, // deny wins over the allowlist
			{"fs/read_text_file", notAllowed},
		}},
		{name: "lab", preset: "lab", calls: []call{
			{"fs/read_text_file", ""},
			{"FS/Write_Text_File", ""},
			{"Bash", ""},
			{"shoal_agent_nodes", ""},
			{"mcp__shoal__agent_open", deny},
		}},
		{name: "lab with an allowlist: only before the preset's allowance", preset: "lab", allowed: []string{"mcp__shoal__agent_output"}, calls: []call{
			{"mcp__shoal__agent_output", ""},
			{"fs/read_text_file", notAllowed},
			{"mcp__shoal__agent_nodes", notAllowed},
		}},
		{name: "auto", preset: "AUTO", calls: []call{
			{"Bash", auto},
			{"Write", auto},
			{"Edit", auto},
			{"MultiEdit", auto},
			{"run_shell_command", auto},
			{"fs/write_text_file", auto},
			{"apply_patch", auto},
			{"delete_file", auto},
			{"move_file", auto},
			{"Read", ""},
			{"Grep", ""},
			{"fs/read_text_file", ""},
			{"mcp__shoal__agent_output", ""},
			{"mcp__shoal__agent_open", deny},
		}},
		{name: "auto refuses a mutating tool even when allowed", preset: "auto", allowed: []string{"Bash", "Read"}, calls: []call{
			{"Bash", auto},
			{"Read", ""},
			{"Grep", notAllowed},
		}},
		{name: "bypass", preset: "bypass", calls: []call{
			{"Bash", ""},
			{"fs/write_text_file", ""},
			{"mcp__shoal__agent_open", deny},
		}},
		{name: "bypass, guard lifted", preset: "bypass", deny: &none, calls: []call{
			{"mcp__shoal__agent_open", ""},
		}},
		{name: "bypass with its own deny list", preset: "bypass", deny: list("Write"), calls: []call{
			{"write", deny},
			{"Read", ""},
		}},
	}
	for _, tc := range tests {
		pol, err := schemas.ComposePolicy(tc.preset, "", tc.allowed, tc.deny, false)
		if err != nil {
			t.Fatalf("%s: compose: %v", tc.name, err)
		}
		for _, c := range tc.calls {
			ok, why := decide(pol, c.tool)
			if ok != (c.why == "") || why != c.why {
				t.Errorf("%s: decide(%q) = %v, %q; want %v, %q", tc.name, c.tool, ok, why, c.why == "", c.why)
			}
		}
	}
}

func TestDecideUnknownPreset(t *testing.T) {
	t.Parallel()
	for _, pol := range []schemas.Policy{{Preset: "weird"}, {}} {
		ok, why := decide(pol, "Read")
		want := `unknown permission preset "` + string(pol.Preset) + `"`
		if ok || why != want {
			t.Errorf("preset %q: decide = %v, %q; want false, %q", pol.Preset, ok, why, want)
		}
	}
}

func TestDeniedAtAsk(t *testing.T) {
	t.Parallel()
	nb, err := schemas.ComposePolicy("notebook", "", nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		deny        []string
		title, kind string
		want        string // "" means not denied
	}{
		{nb.Disallowed, "Read src/main.go", "read", "Read"}, // the title has a '.', so the kind decides
		{nb.Disallowed, "Bash", "other", "Bash"},
		{nb.Disallowed, "READ", "other", "Read"},
		{nb.Disallowed, "echo hi", "execute", "Bash"},
		{nb.Disallowed, "echo hi", "EXECUTE", "Bash"},
		{nb.Disallowed, "find things", "search", "Grep"},
		{nb.Disallowed, "Writing to a.txt", "edit", "Edit"},
		{nb.Disallowed, "rm it", "delete", "Write"},
		{nb.Disallowed, "mv it", "move", "Write"},
		{nb.Disallowed, "Task do something", "other", "Task"},
		{nb.Disallowed, "mcp__shoal__agent_open", "other", ""}, // qualified: judged elsewhere
		{nb.Disallowed, "shoal_agent_open", "other", ""},
		{nb.Disallowed, "Shoal_agent_open", "other", ""},
		{nb.Disallowed, "/tmp/work/a.txt", "other", ""},
		{nb.Disallowed, "https://example.com", "fetch", ""},
		{nb.Disallowed, "", "", ""},
		{nb.Disallowed, "think", "think", ""},
		{[]string{"Bash"}, "/tmp/work/a.txt", "edit", ""},
		{[]string{"Read"}, "Read /tmp/work/a.txt", "other", "Read"}, // only the first word must look unqualified
		{[]string{"fs/read_text_file"}, "fs/read_text_file", "other", ""},
		{[]string{"Read"}, "read.me", "other", ""},
		{[]string{"WebFetch"}, "WebFetch https://example.com", "fetch", "WebFetch"},
		{[]string{"Bash(rm *)"}, "ls", "execute", "Bash(rm *)"},
		{[]string{"mcp__shoal"}, "Bash", "execute", ""},
		{nil, "Bash", "execute", ""},
	}
	for _, tc := range tests {
		entry, denied := deniedAtAsk(tc.deny, tc.title, tc.kind)
		if denied != (tc.want != "") || entry != tc.want {
			t.Errorf("deniedAtAsk(%v, %q, %q) = %q, %v; want %q", tc.deny, tc.title, tc.kind, entry, denied, tc.want)
		}
	}
}

func TestCallPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		rawInput  string
		locations []string
		want      []string
	}{
		{"claude Write", `{"file_path":"/w/a.txt","content":"x"}`, nil, []string{"/w/a.txt"}},
		{"a shell command is not parsed", `{"command":"cat /etc/passwd","description":"read it"}`, nil, nil},
		{"every path key, keys in any case, sorted",
			`{"filePath":"a","paths":["b","c","",3],"cwd":"d","dir":"e","directory":"f","file":"g","FILE":"h","pattern":"*.go","path":7,"Notebook_Path":"i"}`,
			[]string{"a", "z", ""},
			[]string{"h", "i", "d", "e", "f", "g", "a", "b", "c", "z"}},
		{"rawInput not an object", `["/x"]`, []string{"/l"}, []string{"/l"}},
		{"no rawInput", ``, []string{"/l", "/l"}, []string{"/l"}},
		{"null rawInput", `null`, nil, nil},
	}
	for _, tc := range tests {
		got := callPaths(json.RawMessage(tc.rawInput), tc.locations)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: callPaths = %q; want %q", tc.name, got, tc.want)
		}
	}
}
