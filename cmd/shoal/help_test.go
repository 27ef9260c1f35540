package main

import (
	"flag"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			code, stdout, stderr := runShoal(t, t.TempDir(), nil, args...)
			if code != 0 || !strings.HasPrefix(stdout, "Usage: shoal "+c.name) {
				t.Errorf("shoal %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
			}
		}
	}
	code, stdout, _ := runShoal(t, t.TempDir(), nil, "help")
	if code != 0 {
		t.Fatalf("shoal help exited %d", code)
	}
	for _, c := range commands() {
		if !strings.Contains(stdout, "  "+c.name+" ") {
			t.Errorf("shoal help does not list %s", c.name)
		}
	}
	if code, _, stderr := runShoal(t, t.TempDir(), nil); code != 2 || !strings.Contains(stderr, "Usage: shoal <command>") {
		t.Errorf("bare shoal: exit %d, stderr %q", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runShoal(t, t.TempDir(), nil, "version")
	if code != 0 || !strings.HasPrefix(stdout, "shoal ") || !strings.Contains(stdout, "go1.") {
		t.Fatalf("shoal version: exit %d, %q", code, stdout)
	}
}

// Every flag of every command is in one of its help's groups, under that
// group's title, with a placeholder naming its value (or none, a boolean)
// and its default said once; a setting shows its environment variable and
// nothing else does. Old spellings are hidden.
func TestHelpGroupsFlagsWithPlaceholdersAndOneDefault(t *testing.T) {
	t.Parallel()
	mentions := regexp.MustCompile(`\bdefault[: ]`)
	for _, c := range commands() {
		fs, _, _ := c.flagSet()
		group := map[string]string{}
		for _, g := range c.groups() {
			for _, name := range g.flags {
				if fs.Lookup(name) == nil {
					t.Errorf("shoal %s: group %q names --%s, which the command does not have", c.name, g.title, name)
				}
				if prev, ok := group[name]; ok {
					t.Errorf("shoal %s: --%s is in groups %q and %q", c.name, name, prev, g.title)
				}
				group[name] = g.title
			}
		}
		code, out, _ := runShoal(t, t.TempDir(), nil, c.name, "--help")
		if code != 0 {
			t.Fatalf("shoal %s --help: exit %d", c.name, code)
		}
		blocks, under := helpBlocks(out)
		fs.VisitAll(func(f *flag.Flag) {
			if c.renamed(f.Name) != "" {
				if _, shown := blocks[f.Name]; shown {
					t.Errorf("shoal %s --help shows --%s, an old spelling", c.name, f.Name)
				}
				return
			}
			if group[f.Name] == "" {
				t.Errorf("shoal %s: --%s is in no group: add it to groupsByCommand in groups.go", c.name, f.Name)
				return
			}
			block, ok := blocks[f.Name]
			if !ok || under[f.Name] != group[f.Name] {
				t.Errorf("shoal %s --help: --%s is under %q, want %q:\n%s", c.name, f.Name, under[f.Name], group[f.Name], out)
				return
			}
			typ, _ := flag.UnquoteUsage(f)
			isBool := false
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok {
				isBool = b.IsBoolFlag()
			}
			switch {
			case isBool && typ != "":
				t.Errorf("shoal %s: boolean --%s has a placeholder %q", c.name, f.Name, typ)
			case !isBool && !strings.Contains(f.Usage, "`"):
				t.Errorf("shoal %s: --%s has no `placeholder` in its usage (help shows %q)", c.name, f.Name, typ)
			case slices.Contains([]string{"string", "value", "number", "int", "uint", "float"}, typ):
				t.Errorf("shoal %s: --%s has the placeholder %q; name what the value is", c.name, f.Name, typ)
			}
			if n := len(mentions.FindAllString(block, -1)); n > 1 {
				t.Errorf("shoal %s: --%s says its default %d times:\n%s", c.name, f.Name, n, block)
			}
			if d := f.DefValue; d != "" && d != "false" && d != "0" && d != "0s" &&
				!strings.Contains(block, "(default "+d+")") && !strings.Contains(block, "(default: ") {
				t.Errorf("shoal %s: --%s does not show its default %q:\n%s", c.name, f.Name, d, block)
			}
			env := "env SHOAL_" + envName(f.Name)
			if has := strings.Contains(block, env); has != c.isSetting(f.Name) {
				t.Errorf("shoal %s: --%s is a setting: %v, but its help shows %q: %v", c.name, f.Name, c.isSetting(f.Name), env, has)
			}
		})
	}
}

// helpBlocks splits a command's help into each flag's entry and the title
// of the group it is under.
func helpBlocks(help string) (blocks, under map[string]string) {
	blocks, under = map[string]string{}, map[string]string{}
	title, name := "", ""
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.HasPrefix(line, "  --"):
			name = strings.Fields(line)[0][2:]
			blocks[name], under[name] = line+"\n", title
		case strings.HasPrefix(line, "      ") && name != "":
			blocks[name] += line + "\n"
		case line != "" && !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":"):
			title, name = strings.TrimSuffix(line, ":"), ""
		default:
			name = ""
		}
	}
	return blocks, under
}
