package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"
)

func configCommand() *command {
	c := &command{
		name:    "config",
		args:    "[command] [flags]",
		summary: "show the effective settings and where each comes from",
		help: `
Prints the settings of a command as it would run them: each setting's
value and where it came from (the default, the config file, an
environment variable, a flag, or Kaimon's config), as TOML a config file
can take. Give the command's flags after it to see what they change:

    shoal config up --port 4333

With no command it prints every command's settings, the commands that
share them together. Tokens are not shown.`,
		flags: func(*flag.FlagSet) runner { return nil },
	}
	c.direct = runConfig
	return c
}

// runConfig is shoal config [command] [flags].
func runConfig(_ context.Context, env *environment, args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		c := findCommand(args[0])
		if c == nil || c.direct != nil {
			return usagef("no command %q has settings%s", args[0], didYouMean(args[0], commandNames(), ""))
		}
		s, err := effective(env, c, args[1:])
		if err != nil {
			return err
		}
		s.print(env.io.out, "shoal "+c.name)
		return nil
	}
	// Every command: only --config can apply to them all.
	fs := flag.NewFlagSet("shoal config", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "", "")
	rest, err := parseArgs(fs, args)
	if err != nil {
		return configCommand().flagError(fs, err)
	}
	if len(rest) > 0 {
		return usagef("unexpected argument %q: give a command first (shoal config up --port 4333)", rest[0])
	}
	var shared []string
	if *path != "" {
		shared = []string{"--config", *path}
	}
	var sections []*effectiveSettings
	var names [][]string
	for _, c := range commands() {
		if c.direct != nil {
			continue
		}
		s, err := effective(env, c, shared)
		if err != nil {
			return err
		}
		if len(s.rows) == 0 {
			continue
		}
		same := -1
		for i, o := range sections {
			if o.equal(s) {
				same = i
			}
		}
		if same < 0 {
			sections, names = append(sections, s), append(names, nil)
			same = len(sections) - 1
		}
		names[same] = append(names[same], c.name)
	}
	for i, s := range sections {
		if i > 0 {
			fmt.Fprintln(env.io.out)
		}
		s.print(env.io.out, "shoal "+strings.Join(names[i], ", "))
	}
	return nil
}

// effectiveSettings are a command's settings as it would run them.
type effectiveSettings struct {
	configLine string
	rows       []settingRow
}

type settingRow struct {
	group, key, value, from string
}

// effective parses args as the command would and reads off its settings.
func effective(env *environment, c *command, args []string) (*effectiveSettings, error) {
	fs, configPath, _ := c.flagSet()
	l, err := c.parseSettings(fs, args, configPath, env.getenv)
	if err != nil {
		return nil, err
	}
	if len(l.positional) > 0 {
		return nil, usagef("unexpected argument %q: shoal config takes a command's flags, not its arguments", l.positional[0])
	}
	s := &effectiveSettings{configLine: configFileLine(l, env.getenv)}
	for _, g := range c.groups() {
		if !g.setting {
			continue
		}
		for _, name := range g.flags {
			f := fs.Lookup(name)
			if f == nil {
				continue
			}
			from := l.from[name]
			if from == "" {
				from = "default"
				if d := usageDefault(f.Usage); d != "" {
					from = "default: " + d
				}
			}
			s.rows = append(s.rows, settingRow{g.title, name, tomlValue(f), from})
		}
	}
	return s, nil
}

func configFileLine(l *loaded, getenv func(string) string) string {
	state := "not there"
	if l.configRead {
		state = "read"
	}
	via := "the default place"
	switch {
	case l.from["config"] != "":
		via = l.from["config"]
	case getenv("SHOAL_CONFIG") != "":
		via = "env SHOAL_CONFIG"
	}
	return fmt.Sprintf("config file %s (%s; from %s)", l.configFile, state, via)
}

func (s *effectiveSettings) equal(o *effectiveSettings) bool {
	if s.configLine != o.configLine || len(s.rows) != len(o.rows) {
		return false
	}
	for i := range s.rows {
		if s.rows[i] != o.rows[i] {
			return false
		}
	}
	return true
}

func (s *effectiveSettings) print(w io.Writer, title string) {
	fmt.Fprintf(w, "# %s\n# %s\n", title, s.configLine)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, r := range s.rows {
		if i == 0 || r.group != s.rows[i-1].group {
			// A comment line with no tab ends the column block, so
			// each group is aligned by itself.
			fmt.Fprintf(tw, "\n# %s\n", r.group)
		}
		fmt.Fprintf(tw, "%s = %s\t# %s\n", r.key, r.value, r.from)
	}
	tw.Flush()
}

var defaultInUsage = regexp.MustCompile(`\(default: ([^)]*)\)`)

// usageDefault is the default a usage describes, "(default: …)", or "".
func usageDefault(usage string) string {
	if m := defaultInUsage.FindStringSubmatch(usage); m != nil {
		return m[1]
	}
	return ""
}

// tomlValue is the flag's value as TOML: bare for a boolean or a number,
// else a string. A token is not shown.
func tomlValue(f *flag.Flag) string {
	v := f.Value.String()
	if strings.HasSuffix(f.Name, "-token") && v != "" {
		return `"<hidden>"`
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && v != "" {
		return v
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case int, int64, uint, uint64, float64:
			return v
		}
	}
	return tomlString(v)
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
