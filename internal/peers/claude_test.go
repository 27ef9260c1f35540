package peers_test

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// The pinned claude CLI, installed by the test command, completes one
// stream-json turn against the fake model server, offline.
func TestClaudeCompletesOneTurn(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Thinking: "A greeting is wanted.", Text: "Hello from the fake model."})

	argv := peers.Claude.Command(t)
	ctx := t.Context()
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:],
		"-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
		"--include-partial-messages", "--model", "sonnet", "--permission-mode", "acceptEdits")...)
	cmd.Dir = t.TempDir()
	cmd.Env = peers.ClaudeEnv(t.TempDir(), fake.URL())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	if _, err := stdin.Write([]byte(`{"type":"user","message":{"role":"user","content":[{"type":"text","text":"Say hello."}]}}` + "\n")); err != nil {
		t.Fatal(err)
	}
	lines := make(chan map[string]any)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				lines <- m
			}
		}
	}()
	var kinds []string
	deadline := time.After(60 * time.Second)
	for result := false; !result; {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatalf("claude closed stdout before a result; saw %v; stderr:\n%s", kinds, stderr.String())
			}
			kinds = append(kinds, m["type"].(string))
			if m["type"] != "result" {
				continue
			}
			result = true
			if m["is_error"] != false || m["result"] != "Hello from the fake model." {
				t.Fatalf("result: %v", m)
			}
		case <-deadline:
			t.Fatalf("no result from claude; saw %v; stderr:\n%s", kinds, stderr.String())
		}
	}
	stdin.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("claude exited with %v after stdin closed; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("claude did not exit after stdin closed")
	}
	reqs := fake.Requests()
	if len(reqs) != 1 || reqs[0].Dialect != fakemodel.DialectAnthropic || reqs[0].UserText != "Say hello." {
		t.Fatalf("the fake saw %d requests: %+v", len(reqs), reqs)
	}
}
