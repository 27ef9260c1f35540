package acp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// maxRead is the most fs/read_text_file returns of a file.
const maxRead = 8 << 20

// maxLinks is how many symbolic links resolving one path may follow, as
// Linux allows before ELOOP.
const maxLinks = 40

// workspace confines the paths an agent names to its working directory.
//
// A path is resolved by name (resolve: for the agent's own view of it,
// and to refuse one outside with a clear error), then opened from the
// workspace's directory, held open from the start, with openat2: beneath
// it, through no symbolic link. An agent (a sandboxed one, whose node
// reads and writes as its own user) that swaps a directory on the way
// for a link between the two steps gets an error, not a file outside.
// Where there is no openat2 (not Linux: no agent is sandboxed there) the
// open is by name, its last component not followed.
type workspace struct {
	root string
	dir  *os.File // root, held open
}

// newWorkspace confines paths to cwd, an absolute path to an existing
// directory, with its symlinks resolved; inside beneath, when that is
// set, it is opened from beneath (backend.Spec.Beneath).
func newWorkspace(cwd, beneath string) (*workspace, error) {
	if !filepath.IsAbs(cwd) {
		return nil, fmt.Errorf("workspace %q is not an absolute path", cwd)
	}
	if beneath != "" {
		dir, err := holdRootBeneath(beneath, cwd)
		if err != nil {
			return nil, fmt.Errorf("open workspace: %w", err)
		}
		return &workspace{root: cwd, dir: dir}, nil
	}
	root, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return nil, fmt.Errorf("resolve workspace: %w", err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("resolve workspace: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("workspace %s is not a directory", cwd)
	}
	dir, err := holdRoot(root)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return &workspace{root: root, dir: dir}, nil
}

// close lets the workspace's directory go.
func (w *workspace) close() { w.dir.Close() }

// open opens resolved, a path resolve returned, from the workspace's
// directory, refusing anything that is not a regular file by the time it
// is open; O_NONBLOCK keeps a FIFO swapped in from blocking the open.
func (w *workspace) open(resolved string, flag int, perm fs.FileMode) (*os.File, error) {
	rel, err := filepath.Rel(w.root, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("path is outside this agent's workspace: %s", resolved)
	}
	f, err := openIn(w.dir, rel, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, errors.New("not a regular file")
	}
	return f, nil
}

// mkdirs makes the directories of resolved, a directory resolve
// returned, as open opens.
func (w *workspace) mkdirs(resolved string) error {
	rel, err := filepath.Rel(w.root, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("path is outside this agent's workspace: %s", resolved)
	}
	return mkdirIn(w.dir, rel)
}

// resolve returns where path leads, absolute and free of symlinks, if that
// is inside the workspace. A relative path is taken from the root. Every
// symlink on the way is followed, a dangling one too (so writing through
// it cannot create a file elsewhere), and ".." is applied after the link
// before it, as the kernel does; what does not exist yet is kept as
// written.
func (w *workspace) resolve(path string) (string, error) {
	if path == "" {
		return "", errors.New("no path given")
	}
	start := w.root
	if filepath.IsAbs(path) {
		start = string(filepath.Separator)
	}
	resolved, err := realpath(start, path)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", path, err)
	}
	if !inside(w.root, resolved) {
		return "", fmt.Errorf("path is outside this agent's workspace: %s", path)
	}
	return resolved, nil
}

// realpath resolves path from dir, a directory free of symlinks, one
// component at a time; components that do not exist are appended as they
// are (like realpath -m).
func realpath(dir, path string) (string, error) {
	todo := strings.Split(path, string(filepath.Separator))
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			dir = filepath.Dir(dir)
			continue
		}
		next := filepath.Join(dir, c)
		fi, err := os.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
			dir = next // does not exist (yet): nothing to follow
			continue
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink == 0:
			dir = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", next)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			dir = string(filepath.Separator)
		}
		todo = append(strings.Split(target, string(filepath.Separator)), todo...)
	}
	return dir, nil
}

// inside reports whether path lies in root, comparing whole components.
func inside(root, path string) bool {
	if path == root {
		return true
	}
	if !strings.HasSuffix(root, string(filepath.Separator)) {
		root += string(filepath.Separator)
	}
	return strings.HasPrefix(path, root)
}

// readText serves fs/read_text_file. With line or limit it returns that
// window of lines (line is 1-based, below 1 counts as 1; limit nil means
// to the end), joined by "\n"; otherwise the whole file. Either may be at
// most maxRead bytes. Only regular files are read: a FIFO or a device is
// refused before it is opened, so reading it cannot block. A missing file
// is an error that errors.Is(err, fs.ErrNotExist) recognises.
func readText(w *workspace, path string, line, limit *int) (string, error) {
	resolved, err := w.resolve(path)
	if err != nil {
		return "", err
	}
	if limit != nil && *limit < 0 {
		return "", fmt.Errorf("read %s: limit %d is negative", path, *limit)
	}
	f, err := w.open(resolved, os.O_RDONLY, 0)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if line == nil && limit == nil && fi.Size() > maxRead {
		return "", fmt.Errorf("read %s: the file is larger than %d MiB; read it by line and limit", path, maxRead>>20)
	}
	if line == nil && limit == nil {
		b, err := io.ReadAll(io.LimitReader(f, maxRead+1))
		if err != nil {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
		if len(b) > maxRead {
			return "", fmt.Errorf("read %s: the file is larger than %d MiB; read it by line and limit", path, maxRead>>20)
		}
		return string(b), nil
	}
	from, n := 1, -1
	if line != nil && *line > 1 {
		from = *line
	}
	if limit != nil {
		n = *limit
	}
	s, err := window(f, from, n)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return s, nil
}

// window returns limit lines (all when negative) from line from on,
// without their "\n", joined by "\n"; lines before from are skipped
// without being kept.
func window(r io.Reader, from, limit int) (string, error) {
	// Lines before from are read to be skipped: at most maxScan of them
	// (a sparse file of terabytes costs the node no more than that).
	r = &scanLimit{r: r, left: maxScan}
	br := bufio.NewReader(r)
	var out []byte
	for n, taken := 1, 0; limit < 0 || taken < limit; n++ {
		keep := n >= from
		start := len(out)
		if keep && taken > 0 {
			out = append(out, '\n')
		}
		empty := true
		for {
			chunk, err := br.ReadSlice('\n')
			empty = empty && len(chunk) == 0
			if keep {
				out = append(out, bytes.TrimSuffix(chunk, []byte("\n"))...)
				if len(out) > maxRead {
					return "", fmt.Errorf("the lines asked for are more than %d MiB", maxRead>>20)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				if empty {
					out = out[:start] // the file ended with the line before
				}
				return string(out), nil
			}
			if err != nil {
				return "", err
			}
			break
		}
		if keep {
			taken++
		}
	}
	return string(out), nil
}

// maxScan is the most of a file a read by line goes through.
const maxScan = 1 << 30

// errScanLimit is a read by line that would go past maxScan.
var errScanLimit = fmt.Errorf("the lines asked for lie past the first %d GiB of the file", maxScan>>30)

// scanLimit is a reader that fails past its limit.
type scanLimit struct {
	r    io.Reader
	left int64
}

func (l *scanLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errScanLimit
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// writeText serves fs/write_text_file: it makes the parent directories
// (0o755) and writes content, a new file with mode 0o644, an existing one
// keeping its mode. Only a regular file is written: never a FIFO, a device
// or a directory.
func writeText(w *workspace, path, content string) error {
	resolved, err := w.resolve(path)
	if err != nil {
		return err
	}
	if fi, err := os.Lstat(resolved); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("write %s: not a regular file", path)
	}
	if err := w.mkdirs(filepath.Dir(resolved)); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := w.open(resolved, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := io.WriteString(f, content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
