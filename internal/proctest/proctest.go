// Package proctest finds processes of the machine for tests that check
// what an agent left running.
package proctest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Sleep finds a running `sleep <arg>` and returns its pid, or 0.
func Sleep(arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		parts := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(parts) == 2 && parts[0] == "sleep" && parts[1] == arg {
			return pid
		}
	}
	return 0
}
