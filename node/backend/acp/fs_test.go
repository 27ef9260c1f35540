//go:build linux || darwin

package acp

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
)

// tree is a workspace with symlinks in every direction:
//
//	base/ws/            the workspace
//	  in.txt            "inside\n"
//	  sub/
//	  link-file   -> base/out/secret.txt
//	  link-dir    -> base/out
//	  dangling    -> base/out/new.txt (missing)
//	  inner-link  -> in.txt
//	  dangling-in -> new-inside.txt (missing)
//	  up          -> ..
//	  loop1 -> loop2 -> loop1
//	  fifo              a named pipe
//	base/out/secret.txt "secret\n"
//	base/wsx/           a sibling whose name starts with the workspace's
//	base/alias -> ws
type tree struct {
	base, root, out string
	w               *workspace
}

func newTree(t *testing.T) tree {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tr := tree{base: base, root: filepath.Join(base, "ws"), out: filepath.Join(base, "out")}
	for _, d := range []string{tr.root, tr.out, filepath.Join(tr.root, "sub"), filepath.Join(base, "wsx")} {
		must(t, os.Mkdir(d, 0o755))
	}
	must(t, os.WriteFile(filepath.Join(tr.root, "in.txt"), []byte("inside\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(tr.out, "secret.txt"), []byte("secret\n"), 0o644))
	links := map[string]string{
		"ws/link-file":   filepath.Join(tr.out, "secret.txt"),
		"ws/link-dir":    tr.out,
		"ws/dangling":    filepath.Join(tr.out, "new.txt"),
		"ws/inner-link":  "in.txt",
		"ws/dangling-in": "new-inside.txt",
		"ws/up":          "..",
		"ws/loop1":       "loop2",
		"ws/loop2":       "loop1",
		"alias":          "ws",
	}
	for name, target := range links {
		must(t, os.Symlink(target, filepath.Join(base, name)))
	}
	must(t, syscall.Mkfifo(filepath.Join(tr.root, "fifo"), 0o644))
	w, err := newWorkspace(tr.root, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	tr.w = w
	return tr
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNewWorkspace(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	w, err := newWorkspace(filepath.Join(tr.base, "alias"), "")
	if err != nil {
		t.Fatal(err)
	}
	if w.root != tr.root {
		t.Errorf("root through a symlink = %q; want %q", w.root, tr.root)
	}
	for _, cwd := range []string{"ws", "", filepath.Join(tr.base, "missing"), filepath.Join(tr.root, "in.txt")} {
		if _, err := newWorkspace(cwd, ""); err == nil {
			t.Errorf("newWorkspace(%q) succeeded; want an error", cwd)
		}
	}
}

func TestWorkspaceResolve(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	in := func(p string) string { return filepath.Join(tr.root, p) }
	const outside = "path is outside this agent's workspace: "
	tests := []struct {
		path string
		want string // the resolved path, or the start of the error
	}{
		{"", "no path given"},
		{".", tr.root},
		{tr.root, tr.root},
		{tr.root + "/", tr.root},
		{"in.txt", in("in.txt")},
		{"./sub/../in.txt", in("in.txt")},
		{in("in.txt"), in("in.txt")},
		{filepath.Join(tr.base, "alias", "in.txt"), in("in.txt")}, // absolute, through a symlink to the root
		{"new/dir/file.txt", in("new/dir/file.txt")},
		{"missing/../in.txt", in("in.txt")},
		{"inner-link", in("in.txt")},
		{"dangling-in", in("new-inside.txt")},
		{"link-dir/../ws/in.txt", in("in.txt")}, // ".." after a symlink leaves its target, as the kernel does
		{"up/ws/sub", in("sub")},
		{"..", outside},
		{"../out/secret.txt", outside},
		{"sub/../../out/secret.txt", outside},
		{"missing/../../out/secret.txt", outside},
		{"link-file", outside},
		{"link-dir", outside},
		{"link-dir/secret.txt", outside},
		{"link-dir/new/deeper.txt", outside}, // not there yet, under a directory outside
		{"dangling", outside},                // writing through it would create base/out/new.txt
		{"up", outside},
		{"up/out/secret.txt", outside},
		{"../wsx/f.txt", outside}, // shares a prefix, not a component
		{filepath.Join(tr.base, "wsx"), outside},
		{filepath.Join(tr.out, "secret.txt"), outside},
		{"/etc/passwd", outside},
		{"/", outside},
		{"loop1", "resolve loop1: "},
	}
	for _, tc := range tests {
		got, err := tr.w.resolve(tc.path)
		switch {
		case strings.HasPrefix(tc.want, "/"):
			if err != nil || got != tc.want {
				t.Errorf("resolve(%q) = %q, %v; want %q", tc.path, got, err, tc.want)
			}
		case err == nil:
			t.Errorf("resolve(%q) = %q; want an error %q…", tc.path, got, tc.want)
		case !strings.HasPrefix(err.Error(), tc.want):
			t.Errorf("resolve(%q) error %q; want %q…", tc.path, err, tc.want)
		case tc.want == outside && err.Error() != outside+tc.path:
			t.Errorf("resolve(%q) error %q; want it to name the path", tc.path, err)
		}
	}
}

func TestWorkspaceRootIsSlash(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	w, err := newWorkspace("/", "")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"/": "/", "/..": "/", "..": "/", tr.root + "/link-dir/../ws": tr.root} {
		if got, err := w.resolve(path); err != nil || got != want {
			t.Errorf("resolve(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
}

func TestReadTextWindows(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	long := strings.Repeat("x", 10000) // longer than bufio's buffer
	files := map[string]string{
		"three.txt":  "one\ntwo\nthree\n",
		"open.txt":   "a\nb",
		"blanks.txt": "a\n\nb\n",
		"long.txt":   long + "\nend\n",
		"empty.txt":  "",
	}
	for name, content := range files {
		must(t, os.WriteFile(filepath.Join(tr.root, name), []byte(content), 0o644))
	}
	n := func(i int) *int { return &i }
	tests := []struct {
		file        string
		line, limit *int
		want        string
	}{
		{"three.txt", nil, nil, "one\ntwo\nthree\n"},
		{"three.txt", n(1), nil, "one\ntwo\nthree"},
		{"three.txt", n(2), nil, "two\nthree"},
		{"three.txt", n(2), n(1), "two"},
		{"three.txt", nil, n(2), "one\ntwo"},
		{"three.txt", n(0), n(1), "one"},
		{"three.txt", n(-3), n(1), "one"},
		{"three.txt", n(3), n(10), "three"},
		{"three.txt", n(4), nil, ""},
		{"three.txt", n(9), n(1), ""},
		{"three.txt", n(1), n(0), ""},
		{"open.txt", n(2), nil, "b"},
		{"open.txt", n(1), n(5), "a\nb"},
		{"blanks.txt", n(2), n(2), "\nb"},
		{"long.txt", n(1), n(1), long},
		{"long.txt", n(2), n(1), "end"},
		{"empty.txt", nil, nil, ""},
		{"empty.txt", n(1), n(1), ""},
		{"inner-link", nil, nil, "inside\n"},
	}
	for _, tc := range tests {
		got, err := readText(tr.w, tc.file, tc.line, tc.limit)
		if err != nil || got != tc.want {
			t.Errorf("readText(%s, %v, %v) = %q, %v; want %q", tc.file, deref(tc.line), deref(tc.limit), got, err, tc.want)
		}
	}
	if _, err := readText(tr.w, "three.txt", nil, n(-1)); err == nil {
		t.Error("a negative limit was accepted")
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestReadTextCap(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	exact, over := filepath.Join(tr.root, "exact.bin"), filepath.Join(tr.root, "over.bin")
	must(t, os.WriteFile(exact, nil, 0o644))
	must(t, os.Truncate(exact, maxRead))
	must(t, os.WriteFile(over, nil, 0o644))
	must(t, os.Truncate(over, maxRead+1))
	got, err := readText(tr.w, "exact.bin", nil, nil)
	if err != nil || len(got) != maxRead {
		t.Errorf("a file of exactly 8 MiB: %d bytes, %v; want all of it", len(got), err)
	}
	if _, err := readText(tr.w, "over.bin", nil, nil); err == nil || !strings.Contains(err.Error(), "larger than 8 MiB") {
		t.Errorf("a file over 8 MiB: %v; want it refused", err)
	}
	one := 1
	if _, err := readText(tr.w, "over.bin", &one, &one); err == nil || !strings.Contains(err.Error(), "more than 8 MiB") {
		t.Errorf("a line over 8 MiB: %v; want it refused", err)
	}
	// A sparse file of a terabyte, read from its third line (past a
	// second line of a terabyte of zeros): the node reads through at most
	// 1 GiB of it looking for the line.
	huge := filepath.Join(tr.root, "huge.bin")
	must(t, os.WriteFile(huge, []byte("first\n"), 0o644))
	must(t, os.Truncate(huge, 1<<40))
	three := 3
	if _, err := readText(tr.w, "huge.bin", &three, &one); err == nil || !strings.Contains(err.Error(), "past the first 1 GiB") {
		t.Errorf("a line past a terabyte of zeros: %v; want it refused", err)
	}
}

func TestReadTextRefuses(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	tests := []struct{ path, want string }{
		{"fifo", "not a regular file"},
		{"sub", "not a regular file"},
		{".", "not a regular file"},
		{"link-file", "path is outside this agent's workspace"},
		{"link-dir/secret.txt", "path is outside this agent's workspace"},
		{"../out/secret.txt", "path is outside this agent's workspace"},
		{"dangling", "path is outside this agent's workspace"},
		{"", "no path given"},
	}
	for _, tc := range tests {
		done := make(chan error, 1)
		go func() {
			_, err := readText(tr.w, tc.path, nil, nil)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("readText(%q) = %v; want %q", tc.path, err, tc.want)
			}
			if errors.Is(err, fs.ErrNotExist) {
				t.Errorf("readText(%q) = %v; want it not to read as a missing file", tc.path, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("readText(%q) blocked", tc.path)
		}
	}
}

func TestReadTextMissing(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	for _, p := range []string{"missing.txt", "dangling-in", "missing/dir/x.txt"} {
		got, err := readText(tr.w, p, nil, nil)
		if got != "" || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("readText(%q) = %q, %v; want a not-exist error", p, got, err)
		}
	}
}

// What resolve returned is opened through no link: one there now was
// swapped in since.
func TestWorkspaceOpenRefusesASymlink(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	for _, p := range []string{"inner-link", "link-dir/secret.txt", "up/out/secret.txt"} {
		if f, err := tr.w.open(filepath.Join(tr.root, p), os.O_RDONLY, 0); err == nil {
			f.Close()
			t.Errorf("open(%s) followed a symlink", p)
		}
	}
}

func TestWriteText(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	must(t, writeText(tr.w, "new/nested/dir/f.txt", "hello\n"))
	checkFile(t, filepath.Join(tr.root, "new/nested/dir/f.txt"), "hello\n")
	for _, d := range []string{"new", "new/nested", "new/nested/dir"} {
		fi, err := os.Stat(filepath.Join(tr.root, d))
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o755 != 0 {
			t.Errorf("%s: %v, %v; want a directory with at most 0755", d, fi, err)
		}
	}
	fi, err := os.Stat(filepath.Join(tr.root, "new/nested/dir/f.txt"))
	if err != nil || fi.Mode().Perm()&^0o644 != 0 || fi.Mode().Perm()&0o600 != 0o600 {
		t.Errorf("a new file: %v, %v; want mode 0644 less the umask", fi, err)
	}

	private := filepath.Join(tr.root, "private.txt")
	must(t, os.WriteFile(private, []byte("a long first version\n"), 0o600))
	must(t, os.Chmod(private, 0o600))
	must(t, writeText(tr.w, private, "short\n"))
	checkFile(t, private, "short\n")
	if fi, err := os.Stat(private); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("an existing file: %v, %v; want its mode 0600 kept", fi, err)
	}

	must(t, writeText(tr.w, "inner-link", "through a link inside\n"))
	checkFile(t, filepath.Join(tr.root, "in.txt"), "through a link inside\n")
	must(t, writeText(tr.w, "dangling-in", "made\n"))
	checkFile(t, filepath.Join(tr.root, "new-inside.txt"), "made\n")
	must(t, writeText(tr.w, "empty.txt", ""))
	checkFile(t, filepath.Join(tr.root, "empty.txt"), "")
}

func TestWriteTextRefuses(t *testing.T) {
	t.Parallel()
	tr := newTree(t)
	tests := []struct{ path, want, mustNotExist string }{
		{"../out/evil.txt", "path is outside", "out/evil.txt"},
		{"link-dir/evil.txt", "path is outside", "out/evil.txt"},
		{"link-dir/newdir/evil.txt", "path is outside", "out/newdir"},
		{"dangling", "path is outside", "out/new.txt"},
		{"up/evil.txt", "path is outside", "evil.txt"},
		{filepath.Join(tr.base, "wsx", "evil.txt"), "path is outside", "wsx/evil.txt"},
		{"link-file", "path is outside", ""},
		{"sub", "not a regular file", ""},
		{".", "not a regular file", ""},
		{"fifo", "not a regular file", ""},
		{"in.txt/x", "not a directory", "ws/in.txt/x"},
		{"", "no path given", ""},
	}
	for _, tc := range tests {
		done := make(chan error, 1)
		go func() { done <- writeText(tr.w, tc.path, "evil\n") }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("writeText(%q) = %v; want %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("writeText(%q) blocked", tc.path)
		}
		if tc.mustNotExist != "" {
			if _, err := os.Lstat(filepath.Join(tr.base, tc.mustNotExist)); err == nil {
				t.Errorf("writeText(%q) made %s (%v)", tc.path, tc.mustNotExist, err)
			}
		}
	}
	checkFile(t, filepath.Join(tr.out, "secret.txt"), "secret\n")
	checkFile(t, filepath.Join(tr.root, "in.txt"), "inside\n")
}

func checkFile(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || string(b) != want {
		t.Errorf("%s = %q, %v; want %q", path, b, err, want)
	}
}

// A sandboxed gemini's home is its own to write from life to life: a
// settings.json it made a link to the node's user's files is not read
// by the node when its next life begins (the node merged what it read
// into the settings it wrote back, for the agent to read).
func TestGeminiHomeReadsNoLinkTheAgentPlanted(t *testing.T) {
	t.Parallel()
	spec := backend.Spec{AgentID: "g1", Dir: t.TempDir()}
	secret := filepath.Join(t.TempDir(), "creds.json")
	must(t, os.WriteFile(secret, []byte(`{"token":"the node's secret"}`), 0o600))
	dot := filepath.Join(backend.AgentHome(spec, "gemini"), ".gemini")
	must(t, os.MkdirAll(dot, 0o700))
	must(t, os.Symlink(secret, filepath.Join(dot, "settings.json")))
	if _, err := geminiHome(spec, []string{"HOME=" + t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dot, "settings.json"))
	if err != nil || strings.Contains(string(b), "the node's secret") || !strings.Contains(string(b), `"enableInteractiveShell": false`) {
		t.Errorf("the agent's settings after a link it planted: %q %v; want the node's own settings, none of the linked file", b, err)
	}
	if b, _ := os.ReadFile(secret); string(b) != `{"token":"the node's secret"}` {
		t.Errorf("the linked file was changed: %q", b)
	}
}
