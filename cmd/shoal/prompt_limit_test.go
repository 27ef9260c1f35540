package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A prompt larger than the server's message limit (8 MiB by default) is
// a request the fabric can never take: a wrong request (exit 2) said in
// Shoal's words with the limit. It was "unavailable" (exit 4, which tells
// the user to retry once the fabric is back) with the NATS client's
// "nats: maximum payload exceeded".
func TestSendOfAPromptPastTheMessageLimit(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", t.TempDir())
	big := filepath.Join(t.TempDir(), "prompt.txt")
	if err := os.WriteFile(big, []byte(strings.Repeat("a", 9<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"send", "run"} {
		f, err := os.Open(big)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], verb, id, "-")
		cmd.Env = append(baseEnv(t.TempDir()), c.client...)
		cmd.Stdin = f
		var errOut strings.Builder
		cmd.Stderr = &errOut
		cmd.Run()
		f.Close()
		code := cmd.ProcessState.ExitCode()
		if code != exitUsage || !strings.Contains(errOut.String(), "a message of this fabric may hold (shoal up --max-payload)") {
			t.Errorf("shoal %s of a 9 MiB prompt: exit %d (want %d, a request too large), %q", verb, code, exitUsage, errOut.String())
		}
	}
	// The agent is still there and takes a turn of ordinary size.
	if out := c.must("run", id, "Small."); out != "ok" {
		t.Errorf("a turn after: %q", out)
	}
}
