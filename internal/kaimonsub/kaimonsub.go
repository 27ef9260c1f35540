// Package kaimonsub is a Kaimon extension's view of the event bus for
// tests: a libzmq SUB socket (Debian's python3-zmq) that prefix-subscribes
// to "agent:" and decodes every payload with its own reader of Julia's
// Serialization, independent of the Go encoder.
package kaimonsub

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

//go:embed kaimon_sub.py
var script []byte

// Message is one bus message as the subscriber decoded it.
type Message struct {
	Topic       string `json:"topic"`
	Channel     string `json:"channel"`
	Data        string `json:"data"`
	SessionName string `json:"session_name"`
	Error       string `json:"error"`
	Ready       bool   `json:"ready"`
}

// Start runs a subscriber connected to address; it reconnects by itself.
// The channel closes when the subscriber exits.
func Start(t testing.TB, address string) <-chan Message {
	t.Helper()
	ch, _ := StartProcess(t, address)
	return ch
}

// StartProcess is Start, and the subscriber's process (for a test that
// stops it reading, with SIGSTOP).
func StartProcess(t testing.TB, address string) (<-chan Message, *os.Process) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import zmq").CombinedOutput(); err != nil {
		t.Fatalf("python3-zmq is missing (the test command installs it: apt-get install python3-zmq): %v %s", err, out)
	}
	path := filepath.Join(t.TempDir(), "kaimon_sub.py")
	if err := os.WriteFile(path, script, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/python3", path, address, "agent:")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ch := make(chan Message, 1<<16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			var m Message
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m.Error = err.Error()
			}
			ch <- m
		}
	}()
	select {
	case m := <-ch:
		if !m.Ready {
			t.Fatalf("the subscriber said %+v", m)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the subscriber did not start")
	}
	return ch, cmd.Process
}

// Next returns the next message, failing the test after a wait.
func Next(t testing.TB, ch <-chan Message, what string) Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("the subscriber exited before %s", what)
		}
		if m.Error != "" {
			t.Fatalf("the subscriber could not read a message: %s", m.Error)
		}
		return m
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s on the bus", what)
	}
	return Message{}
}
