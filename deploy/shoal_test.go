package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// shoalBin is the shoal binary built from this repository, which the
// deployment files run. The package cannot import cmd/shoal (it is a main
// package), so TestMain builds it once, into scratch, which it removes
// after the tests.
var shoalBin, scratch string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shoal-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scratch = dir
	shoalBin = filepath.Join(dir, "shoal")
	build := exec.Command("go", "build", "-o", shoalBin, "github.com/shoalfabric/shoal/cmd/shoal")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "the deploy tests run the shoal binary, and building it failed: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// accepts reports whether the shoal binary accepts argv (a verb, its
// arguments and flags) as a command line: argv with --help after it
// prints the verb's usage and exits 0 only when every flag before it
// exists and takes the value given. Nothing is started and no
// configuration file is read; a line ending in a flag that wants a value
// would take --help as that value, and is refused. It runs in a directory
// of its own, its HOME, in case it writes anyway.
func accepts(argv []string) error {
	dir, err := os.MkdirTemp(scratch, "accepts-")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shoalBin, append(append([]string{}, argv...), "--help")...)
	cmd.Env = []string{"HOME=" + dir}
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	line := "shoal " + strings.Join(argv, " ")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", line, err, strings.TrimSpace(stderr.String()))
	}
	if !strings.HasPrefix(stdout.String(), "Usage: shoal ") {
		return fmt.Errorf("%s: --help after it printed no usage (a flag without its value?): %s", line, strings.TrimSpace(stdout.String()+stderr.String()))
	}
	return nil
}

var (
	envNamesMu sync.Mutex
	envNamesOf = map[string]map[string]bool{}
	envLine    = regexp.MustCompile(`(?m)^\s+env (SHOAL_[A-Z0-9_]+)$`)
)

// envNames are the SHOAL_* variables `shoal <verb>` reads, from its help.
func envNames(t *testing.T, verb string) map[string]bool {
	t.Helper()
	envNamesMu.Lock()
	defer envNamesMu.Unlock()
	if names, ok := envNamesOf[verb]; ok {
		return names
	}
	cmd := exec.Command(shoalBin, verb, "--help")
	cmd.Dir = scratch
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("shoal %s --help: %v", verb, err)
	}
	names := map[string]bool{}
	for _, m := range envLine.FindAllStringSubmatch(string(out), -1) {
		names[m[1]] = true
	}
	if len(names) == 0 {
		t.Fatalf("shoal %s --help names no SHOAL_* variable (lines like \"env SHOAL_NATS\"); its format changed, and this test must learn it:\n%s", verb, out)
	}
	envNamesOf[verb] = names
	return names
}

var (
	verbsOnce sync.Once
	verbList  []string
	verbLine  = regexp.MustCompile(`(?m)^  ([a-z][a-z-]*)  +\S`)
)

// verbs are the commands of the shoal binary, from its help.
func verbs(t *testing.T) []string {
	t.Helper()
	verbsOnce.Do(func() {
		cmd := exec.Command(shoalBin, "--help")
		cmd.Dir = scratch
		out, _ := cmd.Output()
		_, list, _ := strings.Cut(string(out), "Commands:\n")
		list, _, _ = strings.Cut(list, "\n\n")
		for _, m := range verbLine.FindAllStringSubmatch(list, -1) {
			verbList = append(verbList, m[1])
		}
	})
	if !slices.Contains(verbList, "node") {
		t.Fatalf("shoal --help lists the commands %v, without node; its format changed, and this test must learn it", verbList)
	}
	return verbList
}

// documentedCommands are the shoal command lines in text: "shoal", a
// verb, and what follows up to the end of the line, a redirection, a
// pipe, a parenthesis or a command separator.
func documentedCommands(t *testing.T, text string) [][]string {
	t.Helper()
	re := regexp.MustCompile(`(?m)(?:^|[\s(])shoal ((?:` + strings.Join(verbs(t), "|") + `)\b(?:[ \t][^\n>|;&()]*)?)`)
	var out [][]string
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		out = append(out, strings.Fields(m[1]))
	}
	return out
}

// The check of command lines tells an accepted one from a refused one.
func TestAccepts(t *testing.T) {
	t.Parallel()
	if err := accepts([]string{"node", "--nats", "nats://h:4222", "--labels", "a=b"}); err != nil {
		t.Errorf("a valid command line is refused: %v", err)
	}
	for _, bad := range [][]string{
		{"node", "--no-such-flag"},
		{"up", "--port", "many"},
		{"no-such-verb"},
		{"creds", "node", "a", "--out"},
	} {
		if accepts(bad) == nil {
			t.Errorf("shoal %v is accepted", bad)
		}
	}
	if names := envNames(t, "node"); !names["SHOAL_NATS"] || names["SHOAL_NO_SUCH"] {
		t.Errorf("shoal node's variables: %v", names)
	}
	got := documentedCommands(t, "run sudo -u shoal shoal creds node a --out a.creds > x\n(shoal up --auth) && shoal-node x; shoal nodes\nshoal is; shoal bogus --x")
	want := [][]string{{"creds", "node", "a", "--out", "a.creds"}, {"up", "--auth"}, {"nodes"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("documentedCommands: %q, want %q", got, want)
	}
}
