package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// netnsInside marks the copy of this test that runs inside its network
// namespace.
const netnsInside = "SHOAL_TEST_NETNS_INSIDE"

// An acp:opencode agent opens and answers with no network at all: the
// whole fabric (coordinator, node, opencode, the fake model server) runs
// in a network namespace that has only loopback. The test runs itself
// again inside one (unshare needs root, as the test command runs).
func TestOpencodeOpensWithoutANetwork(t *testing.T) {
	if os.Getenv(netnsInside) == "" {
		if os.Geteuid() != 0 {
			t.Fatal("this test makes a network namespace with unshare -n, which needs root (CI runs the tests as root)")
		}
		peers.Opencode.Command(t) // installed before the namespace has no registry
		cmd := exec.Command("unshare", "--net", "--", "sh", "-c", `ip link set lo up && exec "$@"`, "sh",
			os.Args[0], "-test.run", "^TestOpencodeOpensWithoutANetwork$", "-test.v", "-test.count", "1")
		cmd.Env = append(os.Environ(), netnsInside+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestOpencodeOpensWithoutANetwork") {
			t.Fatalf("inside the namespace: %v\n%s", err, out)
		}
		return
	}
	ifs, err := net.Interfaces()
	if err != nil || len(ifs) != 1 || ifs[0].Flags&net.FlagLoopback == 0 {
		t.Fatalf("the namespace has interfaces %+v (%v), want loopback only", ifs, err)
	}
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: "answered offline"})
	dir := t.TempDir()
	env := append(peers.OpencodeEnv(t, filepath.Join(dir, "oc-home"), fake.URL()+"/v1"),
		"XDG_DATA_HOME="+dir+"/data", "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", "/nonexistent/claude", "--opencode", peers.Opencode.Command(t)[0], "--node-name", "offline")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: node offline ready")
	cli := []string{"SHOAL_NATS=" + url}
	code, out, errOut := runShoal(t, t.TempDir(), cli, "open", "--timeout", "30s", "--model", "acp:opencode", t.TempDir())
	if code != 0 {
		t.Fatalf("open without a network: exit %d %s\nshoal up said:\n%s", code, errOut, up.stderrText())
	}
	id := strings.TrimSpace(out)
	if code, out, errOut := runShoal(t, t.TempDir(), cli, "run", "--timeout", "30s", id, "say", "it"); code != 0 || strings.TrimSpace(out) != "answered offline" {
		t.Fatalf("run without a network: exit %d %q %s", code, out, errOut)
	}
}
