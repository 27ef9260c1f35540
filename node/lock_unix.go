//go:build unix

package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/shoalfabric/shoal/schemas"
)

// lockDir takes the node directory for this process, so two nodes never
// share a pid file and reap each other's agents.
func lockDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, "node.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("node dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if holder == "" {
			holder = "another process"
		} else {
			holder = "pid " + holder
		}
		return nil, schemas.Errf(schemas.CodeConflict, "node dir %s is in use by another node (%s); give each node its own --dir", dir, holder)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
