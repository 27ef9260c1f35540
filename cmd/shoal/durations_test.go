package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A negative duration is a wrong command line: shoal up refused
// --keep-for -1s, but took --interrupt-grace -1s (a watchdog's interrupt
// then stopped the agent at once), --turn-timeout -1s and
// --turn-idle-timeout -1s (then "never", which the help gives as 0),
// --stream-max-age -1s and --stop-wait -1s, and ran.
func TestUpRefusesNegativeDurations(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--interrupt-grace", "--turn-timeout", "--turn-idle-timeout", "--stream-max-age", "--stop-wait", "--keep-for", "--node-ttl"} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "up", "--port", "-1", "--no-mcp", "--no-bus", "--node-name", "n", "--claude", "/bin/true", flag, "-1s")
		cmd.Env = baseEnv(t.TempDir())
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		cmd.Run()
		cancel()
		if code := cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(errOut.String(), `"-1s" is negative: a duration is 0 or more`) {
			t.Errorf("shoal up %s -1s: exit %d (want %d, at once), %q", flag, code, exitUsage, errOut.String())
		}
	}
}
