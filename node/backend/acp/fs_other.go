//go:build !linux

package acp

import (
	"io/fs"
	"os"
	"path/filepath"
)

// holdRoot holds nothing where there is no openat2: paths are opened by
// name (no agent is sandboxed on such a node; see workspace).
func holdRoot(root string) (*os.File, error) {
	return os.Open(root)
}

// holdRootBeneath opens root by name (holdRoot).
func holdRootBeneath(_, root string) (*os.File, error) { return holdRoot(root) }

// openIn opens rel inside dir by name; its last component is not
// followed.
func openIn(dir *os.File, rel string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir.Name(), rel), flag, perm)
}

// mkdirIn makes the directories of rel inside dir by name.
func mkdirIn(dir *os.File, rel string) error {
	return os.MkdirAll(filepath.Join(dir.Name(), rel), 0o755)
}
