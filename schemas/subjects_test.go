package schemas_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

func TestValidID(t *testing.T) {
	good := []string{"a", "0", "9f3a1c20", "notebook-1", "a_b-c", strings.Repeat("x", 64)}
	bad := []string{"", "-a", "_a", "A", "a.b", "a*", "a>", "a b", "é", strings.Repeat("x", 65), "a\n"}
	for _, id := range good {
		if err := schemas.ValidID(id); err != nil {
			t.Errorf("ValidID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range bad {
		err := schemas.ValidID(id)
		if err == nil {
			t.Errorf("ValidID(%q) accepted a bad id", id)
			continue
		}
		if !strings.Contains(err.Error(), "id") {
			t.Errorf("ValidID(%q) = %q does not say what is wrong", id, err)
		}
	}
	// The character named is the one there, whole (its first byte read
	// alone named another: 'â' for U+202E), or a byte of none as a byte.
	for id, want := range map[string]string{
		"a\u202eb": `has '\u202e' at position 2`,
		"aéb":      `has 'é' at position 2`,
		"a\xffb":   `has "\xff" at position 2`,
	} {
		if err := schemas.ValidID(id); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidID(%q) = %v, want it to say %s", id, err, want)
		}
	}
}

func TestNewAgentID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := schemas.NewAgentID()
		if len(id) != 8 || schemas.ValidID(id) != nil {
			t.Fatalf("NewAgentID() = %q, want 8 hex chars", id)
		}
		seen[id] = true
	}
	if len(seen) < 99 {
		t.Fatalf("NewAgentID repeats itself: %d distinct of 100", len(seen))
	}
}

func TestSubjects(t *testing.T) {
	if got := schemas.EventSubject("9f3a1c20"); got != "agent.9f3a1c20" {
		t.Errorf("EventSubject = %q", got)
	}
	if got := schemas.ControlSubject("mac-1", schemas.VerbSetModel); got != "shoal.node.mac-1.set_model" {
		t.Errorf("ControlSubject = %q", got)
	}
	if id, ok := schemas.AgentFromSubject("agent.x1"); !ok || id != "x1" {
		t.Errorf("AgentFromSubject(agent.x1) = %q, %v", id, ok)
	}
	for _, s := range []string{"agent.", "agent.A", "agents.x", "agent.x.y"} {
		if _, ok := schemas.AgentFromSubject(s); ok {
			t.Errorf("AgentFromSubject(%q) accepted it", s)
		}
	}
}

func TestMsgID(t *testing.T) {
	id, n, err := schemas.ParseMsgID(schemas.MsgID("ab-1", 42))
	if err != nil || id != "ab-1" || n != 42 {
		t.Fatalf("round trip = %q %d %v", id, n, err)
	}
	for _, bad := range []string{"", "x", ".1", "x.", "x.0", "x.-1", "X.1", "x.1a"} {
		if _, _, err := schemas.ParseMsgID(bad); err == nil {
			t.Errorf("ParseMsgID(%q) accepted it", bad)
		}
	}
}

func FuzzValidID(f *testing.F) {
	for _, s := range []string{"a", "9f3a1c20", "-x", "a.b", "Z", strings.Repeat("y", 64), "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := schemas.ValidID(id)
		if want := idPattern.MatchString(id); (err == nil) != want {
			t.Fatalf("ValidID(%q) = %v, but the pattern says valid=%v", id, err, want)
		}
		if err != nil {
			return
		}
		// A valid id is exactly one subject token and survives a message id.
		subj := schemas.EventSubject(id)
		if strings.Count(subj, ".") != 1 || strings.ContainsAny(subj, " *>\t\r\n") {
			t.Fatalf("EventSubject(%q) = %q is not agent.<one token>", id, subj)
		}
		if got, ok := schemas.AgentFromSubject(subj); !ok || got != id {
			t.Fatalf("AgentFromSubject(%q) = %q, %v", subj, got, ok)
		}
		if got, n, err := schemas.ParseMsgID(schemas.MsgID(id, 7)); err != nil || got != id || n != 7 {
			t.Fatalf("MsgID round trip of %q = %q %d %v", id, got, n, err)
		}
	})
}
