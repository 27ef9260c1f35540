//go:build unix

package node

import (
	"errors"
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
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			// No lock to be had here (a file system without locks, NFS
			// without its lock service): not another node's.
			return nil, fmt.Errorf("cannot lock node dir %s (%v): give the node a --dir on a local file system", dir, err)
		}
		b, _ := os.ReadFile(path)
		holder := strings.TrimSpace(string(b))
		if holder == "" {
			holder = "another process"
		} else {
			holder = "pid " + holder
		}
		return nil, schemas.Errf(schemas.CodeConflict, "node dir %s is in use by another node (%s); give each node its own name (shoal node --node-name NAME, whose directory is its own) or --dir", dir, holder)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
