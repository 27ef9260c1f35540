package acp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/proctest"
)

// race is the racer's turn: in its directory, "d" and "l" (a link to
// $SHOAL_ACP_TEST_OUTSIDE, the node's user's) trade places as fast as
// the kernel renames, while it asks its client again and again to write
// d/pwned and read d/secret. It says how many reads brought the
// outside's secret back.
func race(sc *bufio.Scanner, say func(any)) string {
	outside := os.Getenv("SHOAL_ACP_TEST_OUTSIDE")
	if err := os.Mkdir("d", 0o755); err != nil {
		return err.Error()
	}
	if err := os.Symlink(outside, "l"); err != nil {
		return err.Error()
	}
	stop := proctest.Exchange("d", "l")
	wd, _ := os.Getwd()
	leaked := 0
	for i := range 400 {
		method, params := "fs/write_text_file", map[string]any{"sessionId": "fake-session", "path": wd + "/d/pwned", "content": "pwned"}
		if i%2 == 1 {
			method, params = "fs/read_text_file", map[string]any{"sessionId": "fake-session", "path": wd + "/d/secret"}
		}
		say(map[string]any{"jsonrpc": "2.0", "id": 1000 + i, "method": method, "params": params})
		for sc.Scan() {
			var rep struct {
				ID     int `json:"id"`
				Result *struct {
					Content string `json:"content"`
				} `json:"result"`
			}
			if json.Unmarshal(sc.Bytes(), &rep) != nil || rep.ID != 1000+i {
				continue
			}
			if rep.Result != nil && strings.Contains(rep.Result.Content, "the node's secret") {
				leaked++
			}
			break
		}
	}
	stop()
	return fmt.Sprintf("reads of the secret: %d", leaked)
}

// The files an agent reads and writes through its node (fs/read_text_file,
// fs/write_text_file: opencode and gemini write so) stay in its
// directory while the agent swaps a directory on the way for a link to
// the node's user's files, as a sandboxed agent's tools can: the node
// resolved the path, then opened it by name, and a swap in between
// wrote and read outside the agent's sandbox as the node's user.
func TestACPAgentRacesItsFileRequestsOutOfItsDirectory(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("the node's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sess, rec := startFake(t, "racer", "SHOAL_ACP_TEST_OUTSIDE="+outside)
	n, err := rec.send(sess, "go")
	if err != nil {
		t.Fatal(err)
	}
	evs := rec.result(0, n)
	if text := finalText(evs); text != "reads of the secret: 0" {
		t.Errorf("the racing agent: %q; want no read of the secret", text)
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
		t.Errorf("the racing agent's write landed outside its directory, in %s", outside)
	}
}
