package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// parseSettings fills fs from, in rising precedence, the config file, the
// environment (SHOAL_<FLAG>) and the command line. The config file holds
// flat keys named like the flags.
// It returns the positional arguments.
func parseSettings(fs *flag.FlagSet, args []string, configPath *string, getenv func(string) string) ([]string, error) {
	// A first pass finds --config and rejects unknown flags early.
	if _, err := parseArgs(fs, args); err != nil {
		return nil, flagError(fs, err)
	}
	path, explicit := *configPath, *configPath != ""
	if !explicit {
		path, explicit = getenv("SHOAL_CONFIG"), getenv("SHOAL_CONFIG") != ""
	}
	if !explicit {
		path = filepath.Join(configHome(getenv), "shoal", "config.toml")
	}
	if err := applyFile(fs, path, explicit); err != nil {
		return nil, err
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" || envErr != nil {
			return
		}
		name := "SHOAL_" + envName(f.Name)
		if v, ok := lookupEnv(getenv, name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = usagef("environment %s=%q: %s", name, v, setError(f, err))
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	// The command line wins.
	positional, err := parseArgs(fs, args)
	if err != nil {
		return nil, flagError(fs, err)
	}
	return positional, nil
}

// parseArgs parses flags wherever they stand among the arguments (shoal
// creds node mac --out mac.creds) and returns the others; "--" ends the
// flags, for an argument that starts with a dash.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func envName(flagName string) string {
	return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyFile sets flags from a flat TOML file. A missing file is an error
// only when it was asked for. Keys that no command knows are errors; keys
// of other commands are ignored, so one file serves every command.
func applyFile(fs *flag.FlagSet, path string, explicit bool) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return nil
		}
		return usagef("config file %s: %v", path, pathless(err))
	}
	var values map[string]any
	if _, err := toml.Decode(string(raw), &values); err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return usagef("config file %s: line %d: %s", path, perr.Position.Line, perr.Message)
		}
		return usagef("config file %s: %v", path, err)
	}
	known := allFlagNames()
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := values[k]
		if _, ok := v.(map[string]any); ok {
			return usagef("config file %s: [%s]: tables are not used; write flat keys named like the flags", path, k)
		}
		if !known[k] {
			return usagef("config file %s: unknown setting %q", path, k)
		}
		if fs.Lookup(k) == nil {
			continue
		}
		if err := fs.Set(k, fileValue(v)); err != nil {
			return usagef("config file %s: %s = %q: %s", path, k, fileValue(v), setError(fs.Lookup(k), err))
		}
	}
	return nil
}

func fileValue(v any) string {
	switch x := v.(type) {
	case []any:
		parts := make([]string, len(x))
		for i, p := range x {
			parts[i] = fmt.Sprint(p)
		}
		return strings.Join(parts, ",")
	case time.Duration:
		return x.String()
	}
	return fmt.Sprint(v)
}

// allFlagNames is every flag of every command.
func allFlagNames() map[string]bool {
	names := map[string]bool{}
	for _, c := range commands() {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(fs)
		fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	}
	return names
}

func flagError(fs *flag.FlagSet, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		msg = "unknown flag -" + rest
	}
	return usagef("%s (see %s --help)", msg, fs.Name())
}

// setError says what a flag wanted, where the flag package only says
// "parse error".
func setError(f *flag.Flag, err error) string {
	msg := err.Error()
	if msg != "parse error" && msg != "value out of range" {
		return msg
	}
	want := "a value"
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool:
			want = "true or false"
		case int, int64, uint, uint64:
			want = "an integer"
		case float64:
			want = "a number"
		}
	}
	return msg + ": want " + want
}

func pathless(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Directories, after the XDG base directory specification.

func home(getenv func(string) string) string {
	if h := getenv("HOME"); h != "" {
		return h
	}
	h, _ := os.UserHomeDir()
	return h
}

func xdg(getenv func(string) string, name, fallback string) string {
	if d := getenv(name); d != "" && filepath.IsAbs(d) {
		return d
	}
	return filepath.Join(home(getenv), fallback)
}

func configHome(getenv func(string) string) string {
	return xdg(getenv, "XDG_CONFIG_HOME", ".config")
}

func dataHome(getenv func(string) string) string {
	return xdg(getenv, "XDG_DATA_HOME", filepath.Join(".local", "share"))
}

func cacheHome(getenv func(string) string) string {
	return xdg(getenv, "XDG_CACHE_HOME", ".cache")
}

// Flag value types beyond the standard library's.

// durationValue accepts Go durations plus a day suffix ("7d").
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	if *v.d != 0 && *v.d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(*v.d/(24*time.Hour)), 10) + "d"
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil {
			return fmt.Errorf("%q is not a duration (e.g. 90s, 12h, 7d)", s)
		}
		*v.d = time.Duration(n * float64(24*time.Hour))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (e.g. 90s, 12h, 7d)", s)
	}
	*v.d = d
	return nil
}

func durationFlag(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(durationValue{p}, name, usage)
}

// sizeValue is a byte count with an optional unit: 512MiB, 4GiB, 1GB.
type sizeValue struct{ n *int64 }

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

func (v sizeValue) String() string {
	if v.n == nil {
		return ""
	}
	for _, u := range sizeUnits[:4] {
		if *v.n != 0 && *v.n%u.mult == 0 && *v.n/u.mult < 1024 {
			return strconv.FormatInt(*v.n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(*v.n, 10)
}

func (v sizeValue) Set(s string) error {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return fmt.Errorf("%q is not a size (e.g. 8MiB, 4GiB, 1048576)", s)
	}
	*v.n = n * mult
	return nil
}

func sizeFlag(fs *flag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var(sizeValue{p}, name, usage)
}
