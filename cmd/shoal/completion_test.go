package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// completionScript writes `shoal completion shell` to a file.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	code, out, errOut := runShoal(t, t.TempDir(), nil, "completion", shell)
	if code != 0 || out == "" {
		t.Fatalf("shoal completion %s: exit %d, %s", shell, code, errOut)
	}
	path := filepath.Join(t.TempDir(), "shoal."+shell)
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// shell runs script in the named shell, which the test needs.
func shell(t *testing.T, name string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s is not installed; the completion test needs it (scripts/test installs it): %v", name, err)
	}
	home := t.TempDir()
	cmd := exec.Command(name, args...)
	cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home + "/config", "XDG_DATA_HOME=" + home + "/data", "PATH=" + os.Getenv("PATH"), "TERM=dumb"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// Every command's visible flags, as completion must offer them.
func everyFlag() map[string][]string {
	out := map[string][]string{}
	for _, c := range commands() {
		fs, _, _ := c.flagSet()
		fs.VisitAll(func(f *flag.Flag) {
			if c.renamed(f.Name) == "" {
				out[c.name] = append(out[c.name], "--"+f.Name)
			}
		})
	}
	return out
}

func fields(s string) []string {
	f := strings.Fields(s)
	slices.Sort(f)
	return f
}

// The bash script parses, and completing with it offers the commands,
// each command's flags, and the arguments from a fixed set.
func TestCompletionBash(t *testing.T) {
	t.Parallel()
	script := completionScript(t, "bash")
	shell(t, "bash", "-n", script)
	complete := func(words ...string) []string {
		t.Helper()
		line := "source " + script + "; COMP_WORDS=(" + strings.Join(quoteAll(words), " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(words)-1) + `; _shoal; printf '%s\n' "${COMPREPLY[@]}"`
		return fields(shell(t, "bash", "-c", line))
	}
	for _, c := range []struct {
		words []string
		want  []string
	}{
		{[]string{"shoal", "op"}, []string{"open"}},
		{[]string{"shoal", "open", "--sa"}, []string{"--sandbox", "--sandbox-kind", "--sandbox-net"}},
		{[]string{"shoal", "up", "--log-f"}, []string{"--log-format"}},
		{[]string{"shoal", "completion", ""}, []string{"bash", "fish", "zsh"}},
		{[]string{"shoal", "open", "--model", ""}, nil}, // a value: the default completion
	} {
		if got := complete(c.words...); !slices.Equal(got, c.want) {
			t.Errorf("completing %q offers %q, want %q", c.words, got, c.want)
		}
	}
	for name, flags := range everyFlag() {
		if got, want := complete("shoal", name, "--"), fields(strings.Join(flags, " ")); !slices.Equal(got, want) {
			t.Errorf("shoal %s --<tab> offers %q, want %q", name, got, want)
		}
	}
}

// The zsh script parses; run with zsh's completion functions stubbed, it
// describes the commands and hands _arguments each command's flags.
func TestCompletionZsh(t *testing.T) {
	t.Parallel()
	script := completionScript(t, "zsh")
	shell(t, "zsh", "-n", script)
	stubs := `compdef() { print -r -- "compdef $*" }
_describe() { print -rl -- describe $commands }
_arguments() { print -rl -- arguments "$@" }
source ` + script + `
`
	out := shell(t, "zsh", "-c", stubs+"words=(shoal op); CURRENT=2; _shoal")
	if !strings.Contains(out, "compdef _shoal shoal") || !strings.Contains(out, "open:open an agent in a directory") {
		t.Errorf("zsh, shoal <tab>:\n%s", out)
	}
	for name, flags := range everyFlag() {
		out := shell(t, "zsh", "-c", stubs+"words=(shoal "+name+" --); CURRENT=3; _shoal")
		var offered []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "--") {
				offered = append(offered, l[:strings.IndexAny(l+"[", "[")])
			}
		}
		if got, want := fields(strings.Join(offered, " ")), fields(strings.Join(flags, " ")); !slices.Equal(got, want) {
			t.Errorf("zsh, shoal %s: _arguments gets %q, want %q\n%s", name, got, want, out)
		}
	}
	if out := shell(t, "zsh", "-c", stubs+"words=(shoal open --sa); CURRENT=3; _shoal"); !regexp.MustCompile(`(?m)^--sandbox-net\[comma-separated hosts [^]]*\]:hosts: $`).MatchString(out) {
		t.Errorf("zsh, shoal open --sa:\n%s", out)
	}
}

// The fish script parses, and fish itself completes with it.
func TestCompletionFish(t *testing.T) {
	t.Parallel()
	script := completionScript(t, "fish")
	shell(t, "fish", "--no-execute", script)
	complete := func(line string) []string {
		t.Helper()
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(shell(t, "fish", "-c", "source "+script+"; complete -C '"+line+"'")), "\n") {
			if l != "" {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		slices.Sort(got)
		return got
	}
	for _, c := range []struct {
		line string
		want []string
	}{
		{"shoal op", []string{"open"}},
		{"shoal open --sa", []string{"--sandbox", "--sandbox-kind", "--sandbox-net"}},
		{"shoal completion ", []string{"bash", "fish", "zsh"}},
		{"shoal node --node-n", []string{"--node-name"}},
	} {
		if got := complete(c.line); !slices.Equal(got, c.want) {
			t.Errorf("fish completes %q with %q, want %q", c.line, got, c.want)
		}
	}
	for name, flags := range everyFlag() {
		if got, want := complete("shoal "+name+" --"), fields(strings.Join(flags, " ")); !slices.Equal(got, want) {
			t.Errorf("fish, shoal %s --<tab> offers %q, want %q", name, got, want)
		}
	}
}

func quoteAll(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = "'" + w + "'"
	}
	return out
}

// The bash script completes agent ids, node names and presets from the
// running fabric (the shoal on PATH asks it), and offers nothing, without
// waiting, when there is none.
func TestCompletionBashAsksTheFabric(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", "--id", "tabbed", t.TempDir())
	script := completionScript(t, "bash")
	bin := t.TempDir()
	if err := os.Symlink(os.Args[0], filepath.Join(bin, "shoal")); err != nil {
		t.Fatal(err)
	}
	complete := func(url string, words ...string) []string {
		t.Helper()
		home := t.TempDir()
		line := "source " + script + "; COMP_WORDS=(" + strings.Join(quoteAll(words), " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(words)-1) + `; _shoal; printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command("bash", "-c", line)
		cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home + "/config", "PATH=" + bin + ":" + os.Getenv("PATH"),
			"SHOAL_TEST_MAIN=1", "SHOAL_NATS=" + url, "TERM=dumb"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return fields(string(out))
	}
	presets := []string{"ask", "auto", "bypass", "default", "lab", "notebook", "specialist"}
	for _, k := range []struct {
		words []string
		want  []string
	}{
		{[]string{"shoal", "status", ""}, []string{id}},
		{[]string{"shoal", "close", "tab"}, []string{id}},
		{[]string{"shoal", "open", "--node", ""}, []string{"n"}},
		{[]string{"shoal", "open", "--permission", ""}, presets},
		{[]string{"shoal", "job", "--permission", "b"}, []string{"bypass"}},
	} {
		if got := complete(c.url, k.words...); !slices.Equal(got, k.want) {
			t.Errorf("completing %q offers %q, want %q", k.words, got, k.want)
		}
	}
	if got := complete("nats://127.0.0.1:1", "shoal", "status", ""); len(got) != 0 {
		t.Errorf("with no fabric, completing an agent offers %q", got)
	}
}
