package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
)

// jsonLines fails unless every line of s is a JSON log record, and
// returns their messages.
func jsonLines(t *testing.T, what, s string) []string {
	t.Helper()
	var msgs []string
	if s == "" {
		return nil
	}
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		var rec struct {
			Time  time.Time `json:"time"`
			Level string    `json:"level"`
			Msg   string    `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Time.IsZero() || rec.Level == "" {
			t.Errorf("%s: a line that is not a JSON log record: %q (%v)", what, line, err)
			continue
		}
		msgs = append(msgs, rec.Level+" "+rec.Msg)
	}
	return msgs
}

// With --log-format json every line shoal up and shoal node write is a
// JSON record: the log on stderr, the status lines on stdout (their
// messages the words of the text form), and a failure.
func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	up := startShoal(t, dir, nil, "up", "--log-format", "json", "--port", "-1", "--no-bus", "--mcp-listen", "127.0.0.1:0",
		"--claude", "/nonexistent/claude", "--node-name", "j")
	var url string
	poll.Until(t, 60*time.Second, "shoal up's JSON ready record", func() bool {
		for _, m := range jsonLines(t, "shoal up stdout", strings.Join(up.stdoutLines(), "\n")) {
			if u, ok := strings.CutPrefix(m, "INFO NATS listening on "); ok {
				url = u
			}
			if m == "INFO ready; Ctrl-C stops" {
				return true
			}
		}
		return false
	})
	node := startShoal(t, t.TempDir(), nil, "node", "--log-format", "json", "--nats", url, "--claude", "/nonexistent/claude", "--node-name", "k")
	poll.Until(t, 60*time.Second, "shoal node's JSON joined record", func() bool {
		for _, m := range jsonLines(t, "shoal node stdout", strings.Join(node.stdoutLines(), "\n")) {
			if strings.HasPrefix(m, "INFO node k joined ") {
				return true
			}
		}
		return false
	})
	for _, p := range []struct {
		name string
		proc *shoalProc
	}{{"shoal node", node}, {"shoal up", up}} {
		if code := p.proc.stop(syscall.SIGTERM); code != 0 {
			t.Errorf("%s exited %d", p.name, code)
		}
		stderr := jsonLines(t, p.name+" stderr", p.proc.stderrText())
		// Both warn that they have no claude CLI: the log is not empty.
		if !strings.Contains(strings.Join(stderr, "\n"), "WARN claude CLI not found") {
			t.Errorf("%s logged %q", p.name, stderr)
		}
		jsonLines(t, p.name+" stdout", strings.Join(p.proc.stdoutLines(), "\n"))
	}
	if msgs := jsonLines(t, "shoal up stdout", strings.Join(up.stdoutLines(), "\n")); msgs[len(msgs)-1] != "INFO stopped" {
		t.Errorf("shoal up's last status record is %q", msgs[len(msgs)-1])
	}

	// A failure once the logger is made is a record too.
	code, stdout, stderr := runShoal(t, t.TempDir(), nil, "up", "--log-format", "json", "--port", "-1", "--host", "0.0.0.0")
	msgs := jsonLines(t, "failed shoal up stderr", stderr)
	if code != exitUsage || stdout != "" || len(msgs) != 1 || !strings.HasPrefix(msgs[0], "ERROR shoal up: ") || !strings.Contains(msgs[0], "without authentication") {
		t.Errorf("a failing shoal up --log-format json: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := runShoal(t, t.TempDir(), nil, "up", "--log-format", "xml"); code != exitUsage || !strings.Contains(stderr, `--log-format "xml" is not text or json`) {
		t.Errorf("--log-format xml: exit %d, %q", code, stderr)
	}
}
