package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// Under --auth, a node with its own credentials (confined: no JetStream of
// its own) runs agents on a caller's repositories: it reads their bundles
// and writes their work through the coordinator's relay, so open --repo,
// diff and fetch work as on any node. With the same credentials it can
// read no bundle but the one each of its agents is opened from, and write
// none outside its agent's repository.
func TestRepositoryOnAConfinedNode(t *testing.T) {
	t.Parallel()
	p := startAuthPool(t, "coordinator", "boss")
	fake, url, creds, as := p.fake, p.url, p.creds, p.as
	must := func(args ...string) string { t.Helper(); return p.must(t, args...) }
	one, two := oneCommitRepo(t, "one", "one\n"), oneCommitRepo(t, "two", "two\n")
	a := must("open", "--repo", one, "--permission", "bypass")
	in, _ := json.Marshal(map[string]string{"command": "echo confined > c.txt", "description": "write"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})
	if out := must("run", a, "Write c.txt."); out != "Written." {
		t.Fatalf("run: %q", out)
	}
	if diff := must("diff", a); !strings.Contains(diff, "+confined") {
		t.Errorf("shoal diff of an agent on a confined node:\n%s", diff)
	}
	if out := must("fetch", a); !strings.HasPrefix(out, "shoal/"+a+" ") {
		t.Errorf("shoal fetch: %q", out)
	}
	if got := gitIn(t, one, "show", "shoal/"+a+":c.txt"); got != "confined" {
		t.Errorf("c.txt on shoal/%s: %q", a, got)
	}
	b := must("open", "--repo", two, "--permission", "bypass")
	record := func(id string) schemas.AgentRecord {
		var rec schemas.AgentRecord
		json.Unmarshal([]byte(must("status", "--json", id)), &rec)
		if rec.Workspace == nil || rec.Workspace.Bundle == "" || rec.Node != "far" {
			t.Fatalf("agent %s's record: %+v", id, rec)
		}
		return rec
	}
	recA, recB := record(a), record(b)

	// The node's own credentials, asking the relay for what is not its
	// agents'.
	nc, err := nats.Connect(url, nats.UserCredentials(creds["far"]), nats.CustomInboxPrefix(schemas.InboxPrefix("node", "far")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	get := func(agent, name string) string {
		body, _ := json.Marshal(schemas.RelayBundleRequest{Name: name})
		m, err := nc.Request(schemas.RelaySubject("far", schemas.RelayBundleGet, agent), body, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(schemas.HeaderRelayError) == "" {
			return "read"
		}
		return string(m.Data)
	}
	put := func(agent, name string) string {
		m := nats.NewMsg(schemas.RelaySubject("far", schemas.RelayBundlePut, agent))
		m.Header.Set(schemas.HeaderBundle, name)
		m.Header.Set(schemas.HeaderBundleOffset, "0")
		m.Header.Set(schemas.HeaderBundleLast, "1")
		m.Data = []byte("not a bundle")
		rep, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(rep.Data)
	}
	for what, got := range map[string]string{
		"another agent's bundle":            get(a, recB.Workspace.Bundle),
		"a bundle of no agent":              get("nosuch", recA.Workspace.Bundle),
		"a write into another's repository": put(a, recB.Workspace.Repo+"/"+strings.Repeat("0", 40)+"-x.bundle"),
	} {
		if !strings.Contains(got, `"code":"forbidden"`) || !strings.Contains(got, "node far may") {
			t.Errorf("%s through the relay with the node's credentials: %s", what, got)
		}
	}
	if m, err := nc.Request(schemas.RelaySubject("far", schemas.RelayBudget, "nosuch"), nil, 10*time.Second); err != nil {
		t.Errorf("the node asking for the budget of an agent it was not given: %v", err)
	} else if !strings.Contains(string(m.Data), `"code":"forbidden"`) {
		t.Errorf("the node asking for the budget of an agent it was not given: %s", m.Data)
	}
	if got := get(b, recB.Workspace.Bundle); strings.Contains(got, "forbidden") {
		t.Errorf("the node's read of its own agent's bundle: %s", got)
	}

	// Scoped credentials are told what they cannot do yet, and why, once.
	authDir := filepath.Join(p.dir, "keys")
	for _, c := range [][2]string{{"client", "cli"}, {"observer", "obs"}} {
		path := filepath.Join(p.dir, c[1]+".creds")
		if code, _, errOut := runShoal(t, p.dir, nil, "creds", c[0], c[1], "--out", path, "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
		p.creds[c[1]] = path
	}
	for _, c := range []struct {
		who  string
		args []string
		want string
	}{
		{"cli", []string{"job", "ls"}, "this needs the coordinator's credentials for now: scoped credentials do not reach the repositories' object store"},
		{"obs", []string{"open", "--repo", one}, "these credentials may only observe"},
	} {
		code, _, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + p.creds[c.who]}, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "shoal "+c.args[0]) > 1 {
			t.Errorf("shoal %v with %s's credentials: exit %d, %q; want a refusal saying %q once", c.args, c.who, code, errOut, c.want)
		}
	}

	// A diff is the coordinator's to ask the node for: client and observer
	// credentials have it through the fabric service, as the observer
	// token has agent_diff over MCP.
	for _, who := range []string{"cli", "obs"} {
		code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + p.creds[who]}, "diff", a)
		if code != 0 || !strings.Contains(out, "+confined") {
			t.Errorf("shoal diff with %s's credentials: exit %d, %q %q", who, code, out, errOut)
		}
	}

	// The confined node holds its agent to a budget it reads through the
	// relay.
	must("budget", "set", a, "--tokens", "1")
	code, _, errOut := runShoal(t, t.TempDir(), as, "run", a, "One more.")
	if code != exitUnavailable || !strings.Contains(errOut, "tokens of its budget of 1") {
		t.Errorf("a turn past the budget on a confined node: exit %d, %q", code, errOut)
	}
}
