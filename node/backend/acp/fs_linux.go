package acp

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// beneath is how a workspace's paths are opened: from its directory,
// held open since the session began, never leaving it, through no
// symbolic link (resolve followed them all, so one found now was swapped
// in since) and no /proc magic link. The kernel holds this for the whole
// walk, however the agent renames what is on the way meanwhile.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// holdRoot opens the workspace's directory to open its paths from.
func holdRoot(root string) (*os.File, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	return os.NewFile(uintptr(fd), root), nil
}

// holdRootBeneath opens root, a directory inside beneath, from beneath
// through no symbolic link: its parent may swap it for a link (see
// backend.Spec.Beneath).
func holdRootBeneath(beneath, root string) (*os.File, error) {
	rel, err := filepath.Rel(beneath, root)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s is not beneath %s", root, beneath)
	}
	b, err := holdRoot(beneath)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	return openIn(b, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// openIn opens rel, a path inside the workspace free of symbolic links
// and "..", beneath dir.
func openIn(dir *os.File, rel string, flag int, perm fs.FileMode) (*os.File, error) {
	how := unix.OpenHow{Flags: uint64(flag | unix.O_CLOEXEC), Mode: uint64(perm.Perm()), Resolve: beneath}
	var fd int
	err := control(dir, func(dirfd int) error {
		var err error
		for range 8 { // EAGAIN: a rename raced the walk; ask again
			if fd, err = unix.Openat2(dirfd, rel, &how); err != unix.EAGAIN {
				break
			}
		}
		return err
	})
	if err != nil {
		return nil, pathError("open", rel, err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), rel)), nil
}

// mkdirIn makes the directories of rel beneath dir (mode 0o755), each
// from the one before it, held open: a directory swapped for a link on
// the way is refused, not followed.
func mkdirIn(dir *os.File, rel string) error {
	cur := dir
	defer func() {
		if cur != dir {
			cur.Close()
		}
	}()
	for c := range strings.SplitSeq(rel, string(filepath.Separator)) {
		if c == "" || c == "." {
			continue
		}
		next, err := openIn(cur, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		if errors.Is(err, fs.ErrNotExist) {
			err = control(cur, func(fd int) error { return unix.Mkdirat(fd, c, 0o755) })
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return pathError("mkdir", filepath.Join(cur.Name(), c), err)
			}
			next, err = openIn(cur, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
		if err != nil {
			return err
		}
		if cur != dir {
			cur.Close()
		}
		cur = next
	}
	return nil
}

// control runs f with dir's descriptor, which stays open meanwhile.
func control(dir *os.File, f func(fd int) error) error {
	rc, err := dir.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// pathError says what an open refused in the agent's words: a path the
// kernel would not walk beneath the workspace changed on the way.
func pathError(op, path string, err error) error {
	if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
		return &os.PathError{Op: op, Path: path, Err: errors.New("the path left the agent's workspace while it was opened (a link swapped in on the way)")}
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}
