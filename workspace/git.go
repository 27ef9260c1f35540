// Package workspace moves a git repository's commits between the machine
// of the person who opens an agent and the node that runs it, and brings
// the agent's work back: the caller's side prepares the commit an agent
// starts on and bundles what the node lacks; the node keeps one cache per
// repository and gives each agent its own checkout, reading the cache's
// objects, on branch shoal/<id>; the agent's changes come back as a
// bundle that lands on the same branch in the caller's repository.
//
// Nothing here changes the caller's checkout, index, stash, HEAD or
// configuration: commits of uncommitted work are made in a temporary
// object directory through a temporary index, and bundles are written
// from a temporary repository that reads the caller's objects. No remote
// URL or credential is read or carried; every git runs with a clean
// environment.
package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// ErrNoGit is returned when git cannot be run.
var ErrNoGit = errors.New("git is not installed (not found on PATH)")

// Available reports git's version, or an error when git cannot be run.
func Available(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return "", ErrNoGit
	}
	out, err := run(ctx, "", nil, nil, "version")
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(strings.TrimSpace(out), "git version "), nil
}

// cleanEnv is the environment every git runs in: the caller's, without
// what would point git at another repository, index or object store, or
// read a person's configuration (and so their credentials, hooks and
// signing): no global or system config, no prompts, no pager.
func cleanEnv(extra []string) []string {
	return gitEnv(false, extra)
}

// gitEnv is cleanEnv, or, when jailed (a git the node runs on an agent's
// checkout), only what a git needs of the node's environment: its PATH
// and time zone, not the node's tokens and credentials, should anything
// the agent wrote make it run a program.
func gitEnv(jailed bool, extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GIT_") || k == "HOME" || k == "XDG_CONFIG_HOME" {
			continue
		}
		if jailed && k != "PATH" && k != "TZ" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_PAGER=cat", "GIT_OPTIONAL_LOCKS=0", "HOME=/nonexistent", "LC_ALL=C")
	return append(env, extra...)
}

// runsNothing are the settings every git Shoal runs is given first: none
// of the programs a repository's configuration can name that the git
// Shoal runs would otherwise start. A sandboxed agent opened in a person's
// repository writes its .git/config, and what Shoal's git there runs, it
// runs as the person, outside the sandbox. Given on the command line, they
// win over the repository's own, and over what its configuration includes;
// git hands them to the gits it runs itself (a fetch's maintenance).
//   - core.fsmonitor: a program git asks which files changed, whenever it
//     reads the work tree against the index (add, write-tree, ls-files);
//   - core.hooksPath: no hook runs (a fetch and update-ref run
//     reference-transaction, an add post-index-change);
//   - log.showSignature, commit.gpgSign: no gpg.program checks a signed
//     commit a log or show prints, or signs the commits Shoal makes;
//   - core.alternateRefsCommand: a fetch into a repository that borrows
//     another's objects asks it for the other's refs; true names none,
//     which costs a bundle's fetch nothing.
//
// The repository's own filter drivers are not given here but left out of
// the person's settings (personsConfig). What else a configuration can
// run, none of Shoal's gits starts: diff.external, textconv and the pager
// are for diff and log's patches (Shoal prints no patch of the caller's
// repository, and its output is never a terminal), merge drivers and
// smudge filters for merges and checkouts it does not make there, and
// sshCommand, credential helpers and packObjectsHook for a network it
// never reaches: it fetches only bundle files and local paths, and
//   - protocol.allow never, but for file: a repository's url.<base>.insteadOf
//     could turn a bundle's path into an ssh:// (or ext::) URL, whose
//     core.sshCommand (or command) git would run; such a fetch fails.
//
// An alias never replaces a command of git's own.
var runsNothing = []string{"-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
	"-c", "log.showSignature=false", "-c", "commit.gpgSign=false", "-c", "core.alternateRefsCommand=true",
	"-c", "protocol.allow=never", "-c", "protocol.file.allow=always"}

// A gitter runs git: as the caller (the zero gitter), or confined by
// jail, which may write the directories and files in writable.
type gitter struct {
	jail     Jail
	writable []string
	max      int      // bytes of output taken, when not 0: past it git is stopped
	env      []string // on the caller's side, the person's settings (persons)
}

// ErrTooMuch is the error of a git whose output passed its gitter's bound.
var ErrTooMuch = errors.New("git's output passed its bound")

// capped is a buffer that takes at most max bytes (0: any), then drops
// the rest (drop), or fails the write and so the git writing to it.
// (Not embedding bytes.Buffer: io.Copy would use its ReadFrom, unbounded.)
type capped struct {
	buf  bytes.Buffer
	max  int
	drop bool
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if c.max > 0 && c.buf.Len()+len(p) > c.max {
		c.over = true
		if c.drop {
			return len(p), nil
		}
		return 0, ErrTooMuch
	}
	return c.buf.Write(p)
}

func (c *capped) String() string { return c.buf.String() }

// run runs git in dir with the clean environment plus extra, and returns
// its standard output. The error carries git's standard error.
func run(ctx context.Context, dir string, extra []string, stdin []byte, args ...string) (string, error) {
	return gitter{}.run(ctx, dir, extra, stdin, args...)
}

func (g gitter) run(ctx context.Context, dir string, extra []string, stdin []byte, args ...string) (string, error) {
	out := &capped{max: g.max}
	err := g.exec(ctx, dir, extra, stdin, out, args...)
	if err != nil && out.over {
		return "", fmt.Errorf("git %s: its output passed %d bytes: %w", args[0], g.max, ErrTooMuch)
	}
	return out.String(), err
}

// scan runs git as run does and hands fn each line of its standard output
// as it comes, without its newline and cut at maxLine bytes: what git
// prints is never held whole, however much it is.
func (g gitter) scan(ctx context.Context, dir string, fn func(line string), args ...string) error {
	l := &lineWriter{fn: fn, max: maxLine}
	err := g.exec(ctx, dir, nil, nil, l, args...)
	l.flush()
	return err
}

// maxLine is what scan takes of a line.
const maxLine = 4 << 10

// exec runs git in dir with the clean environment plus extra, its
// standard output to stdout. The error carries git's standard error.
func (g gitter) exec(ctx context.Context, dir string, extra []string, stdin []byte, stdout io.Writer, args ...string) error {
	argv := append(append([]string{"git"}, runsNothing...), args...)
	if g.jail != nil {
		var err error
		if argv, err = g.jail(argv, g.writable...); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 5 * time.Second // what it left holding its pipes does not hold us
	cmd.Dir = dir
	cmd.Env = gitEnv(g.jail != nil, append(slices.Clip(g.env), extra...))
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	errb := &capped{max: 64 << 10, drop: true}
	cmd.Stdout, cmd.Stderr = stdout, errb
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return ErrNoGit
		}
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("git %s: %s", args[0], msg)
	}
	return nil
}

// lineWriter hands fn each line written to it, without its newline, cut
// at max bytes.
type lineWriter struct {
	fn   func(string)
	max  int
	line []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		if room := l.max - len(l.line); room > 0 {
			l.line = append(l.line, part[:min(room, len(part))]...)
		}
		if i < 0 {
			break
		}
		l.fn(string(l.line))
		l.line = l.line[:0]
		p = p[i+1:]
	}
	return n, nil
}

// flush hands fn what was written after the last newline.
func (l *lineWriter) flush() {
	if len(l.line) > 0 {
		l.fn(string(l.line))
		l.line = l.line[:0]
	}
}

// path runs git for a path (rev-parse --show-toplevel, say) and returns
// its output without the newline that ends it: a path may hold newlines,
// and its first line alone names another directory.
func (g gitter) path(ctx context.Context, dir string, extra []string, args ...string) (string, error) {
	out, err := g.run(ctx, dir, extra, nil, args...)
	return strings.TrimSuffix(out, "\n"), err
}

// alternates is a list of object directories as git reads it in
// objects/info/alternates (sep "\n") or GIT_ALTERNATE_OBJECT_DIRECTORIES
// (sep ":"): each entry quoted C-style, so a colon, a newline or a quote
// in a directory's path is the path's, not a separator.
func alternates(dirs []string, sep string) string {
	var b strings.Builder
	for i, d := range dirs {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteByte('"')
		for j := 0; j < len(d); j++ {
			switch c := d[j]; {
			case c == '"' || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c < 0x20 || c == 0x7f:
				fmt.Fprintf(&b, "\\%03o", c)
			default:
				b.WriteByte(c)
			}
		}
		b.WriteByte('"')
	}
	return b.String()
}

// objectFormat is the hash the repository at dir names its objects by:
// sha1 or sha256.
func objectFormat(ctx context.Context, g gitter, dir string) (string, error) {
	f, err := g.line(ctx, dir, nil, "rev-parse", "--show-object-format")
	if err != nil {
		return "", err
	}
	if f != "sha1" && f != "sha256" {
		return "", fmt.Errorf("objects named by %q, which Shoal does not know", f)
	}
	return f, nil
}

// line runs git and returns the first line of its output, trimmed.
func (g gitter) line(ctx context.Context, dir string, extra []string, args ...string) (string, error) {
	out, err := g.run(ctx, dir, extra, nil, args...)
	first, _, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(first), err
}

// IsCommitID reports whether s is a full hexadecimal object name (SHA-1
// or SHA-256).
func IsCommitID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
