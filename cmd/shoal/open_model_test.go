package main

import (
	"strings"
	"testing"
)

// A model that names its backend wrongly is a wrong request (exit 2),
// said as such: an ACP agent Shoal does not know (a typo), or a local
// model server's model left out. It was answered as a fleet without room
// ("no node can take this agent (n: cannot run acp:opencod agents)",
// exit 4), or with the model server's error.
func TestOpenRefusesAModelThatNamesNoBackend(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	for model, want := range map[string]string{
		"acp:opencod": "unknown ACP agent 'opencod' — known: claude, gemini, opencode",
		"acp:":        "unknown ACP agent '' — known: claude, gemini, opencode",
		"vmlx:":       "names no model: vmlx:<model>",
		"ollama:":     "names no model: ollama:<model>",
	} {
		code, out, errOut := c.shoal("open", "--model", model, c.dir)
		if code != exitUsage || !strings.Contains(errOut, want) {
			t.Errorf("open --model %s: exit %d, %q %q; want exit %d saying %q", model, code, out, strings.TrimSpace(errOut), exitUsage, want)
		}
	}
}
