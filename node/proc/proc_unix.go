//go:build unix

package proc

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// killGroup SIGKILLs every process left in the group led by pgid.
func killGroup(pgid int) {
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// KillGroup SIGKILLs a process group; the node uses it to reap agents a
// previous instance left behind.
func KillGroup(pgid int) error {
	if pgid <= 0 {
		return fmt.Errorf("no process group %d", pgid)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	return nil
}

// WriteBeneath writes b to rel beneath root, a directory of the node's
// that an agent may write into (its own config or home): no component of
// rel is followed if it is a symlink (the agent could have planted one
// pointing out), the file is made anew (never written through a planted
// hardlink), and rel may not climb out with "..". Missing directories are
// made, 0700.
func WriteBeneath(root, rel string, b []byte, perm os.FileMode) error {
	parts := strings.Split(filepath.Clean(rel), string(filepath.Separator))
	if filepath.IsAbs(rel) || slices.Contains(parts, "..") || len(parts) == 0 {
		return fmt.Errorf("%s is not a path beneath %s", rel, root)
	}
	dir, err := unix.Open(root, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer func() { unix.Close(dir) }()
	for _, name := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(dir, name, 0o700); err != nil && err != unix.EEXIST {
			return fmt.Errorf("make %s beneath %s: %w", name, root, err)
		}
		next, err := unix.Openat(dir, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s beneath %s (not a directory, or a symlink): %w", name, root, err)
		}
		unix.Close(dir)
		dir = next
	}
	name := parts[len(parts)-1]
	if err := unix.Unlinkat(dir, name, 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("replace %s beneath %s: %w", rel, root, err)
	}
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return fmt.Errorf("write %s beneath %s: %w", rel, root, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, rel))
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadBeneath reads rel beneath root, a directory an agent may write
// into, as WriteBeneath writes there: through no symlink the agent could
// have planted, and only a regular file of at most max bytes (a FIFO
// planted there does not block the read).
func ReadBeneath(root, rel string, max int64) ([]byte, error) {
	parts := strings.Split(filepath.Clean(rel), string(filepath.Separator))
	if filepath.IsAbs(rel) || slices.Contains(parts, "..") {
		return nil, fmt.Errorf("%s is not a path beneath %s", rel, root)
	}
	dir, err := unix.Open(root, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer func() { unix.Close(dir) }()
	for _, name := range parts[:len(parts)-1] {
		next, err := unix.Openat(dir, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
		}
		unix.Close(dir)
		dir = next
	}
	fd, err := unix.Openat(dir, parts[len(parts)-1], unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, rel))
	defer f.Close()
	return ReadRegular(f, max)
}

// ReadRegular reads f whole if it is a regular file of at most max
// bytes (opened O_NONBLOCK, a FIFO in its place held nothing up).
func ReadRegular(f *os.File, max int64) ([]byte, error) {
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file", f.Name())
	case fi.Size() > max:
		return nil, fmt.Errorf("%s is larger than %d KiB", f.Name(), max>>10)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s is larger than %d KiB", f.Name(), max>>10)
	}
	return b, err
}

// PassNothingOn marks every descriptor from 3 up close-on-exec, so that
// what this process was handed and never meant to pass on (a caller's
// socket, a directory it held open) does not reach the programs it
// starts: an exec keeps every descriptor not so marked, and Go marks only
// those it opens itself. Its start is the place: a process that has not
// yet opened anything holds only what it inherited.
func PassNothingOn() {
	if closeRangeOnExec(3) {
		return
	}
	dir := "/dev/fd"
	if _, err := os.Stat("/proc/self/fd"); err == nil {
		dir = "/proc/self/fd"
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err == nil && fd >= 3 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
}
