package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// loaded is how a command's flags were filled.
type loaded struct {
	positional []string
	configFile string // the config file read, or looked for
	configRead bool   // whether it was there
	// from says where each flag's value came from, by flag name: "flag
	// --port", "env SHOAL_PORT", "config file PATH" or "Kaimon config
	// PATH". A flag left at its default is absent.
	from map[string]string
	// file is what the config file holds, every command's settings.
	file map[string]any
}

// parseSettings fills the command's flags in fs from, in rising
// precedence, the config file, the environment (SHOAL_<NAME>) and the
// command line. Only settings come from the file and the environment
// (groups.go); every other flag comes from the command line alone. Below
// the config file, the image setting Shoal shares with Kaimon comes from
// Kaimon's own config (kaimon.go).
func (c *command) parseSettings(fs *flag.FlagSet, args []string, configPath *string, getenv func(string) string) (*loaded, error) {
	// A first pass finds --config, rejects unknown flags early, and tells
	// which flags the command line sets.
	if _, err := parseArgs(fs, args); err != nil {
		return nil, c.flagError(fs, err)
	}
	var given []string
	fs.Visit(func(f *flag.Flag) { given = append(given, f.Name) })
	l := &loaded{from: map[string]string{}}
	path, explicit := *configPath, *configPath != ""
	if !explicit {
		path, explicit = getenv("SHOAL_CONFIG"), getenv("SHOAL_CONFIG") != ""
	}
	if !explicit {
		path = filepath.Join(configHome(getenv), "shoal", "config.toml")
	}
	l.configFile = path
	read, err := c.applyFile(fs, path, explicit, l)
	if err != nil {
		return nil, err
	}
	l.configRead = read
	if err := c.applyEnv(fs, getenv, l.from); err != nil {
		return nil, err
	}
	// The command line wins. A repeatable flag starts over, so that the
	// first pass's values are not counted twice.
	fs.VisitAll(func(f *flag.Flag) {
		if r, ok := f.Value.(interface{ reset() }); ok {
			r.reset()
		}
	})
	if l.positional, err = parseArgs(fs, args); err != nil {
		return nil, c.flagError(fs, err)
	}
	for _, name := range given {
		l.from[c.canonical(name)] = "flag --" + name
	}
	if err := applyKaimon(fs, getenv, l.from); err != nil {
		return nil, err
	}
	if err := c.fabricAddress(fs, l, getenv); err != nil {
		return nil, err
	}
	return l, nil
}

// layer ranks where a setting came from: the command line over the
// environment over the config file over nowhere.
func layer(src string) int {
	switch {
	case strings.HasPrefix(src, "flag "):
		return 3
	case strings.HasPrefix(src, "env "):
		return 2
	case src != "":
		return 1
	}
	return 0
}

// fabricAddress makes one setting of where the fabric is serve both
// shoal up and its clients. A client (or node) given no nats dials the
// port (and host) the config file or the environment gives shoal up; and
// shoal up takes a nats from the config file or the environment as where
// it listens, not as an external server, which only --nats on its own
// command line names. Where both are given, the one from the later place
// wins on both sides (the environment over the file); from one place,
// they must name the same port (oneFabricPort).
func (c *command) fabricAddress(fs *flag.FlagSet, l *loaded, getenv func(string) string) error {
	setting := func(name string) (string, string) {
		env := "SHOAL_" + envName(name)
		if v := getenv(env); v != "" {
			return v, "env " + env
		}
		if v, ok := l.file[name]; ok {
			return fileValue(v), "config file " + l.configFile
		}
		return "", ""
	}
	_, portFrom := setting("port")
	if fs.Lookup("nats") == nil {
		return nil
	}
	if c.name == "up" && strings.HasPrefix(l.from["nats"], "flag ") {
		// --nats names a server shoal up does not run: where its own
		// would listen means nothing, and was ignored without a word.
		for _, f := range []string{"port", "host"} {
			if strings.HasPrefix(l.from[f], "flag ") {
				return usagef("--nats uses a NATS deployment Shoal does not run: --%s sets where shoal up's own server listens, and cannot go with it", f)
			}
		}
	}
	if c.name != "bench" && !strings.HasPrefix(l.from["nats"], "flag ") && !strings.HasPrefix(l.from["port"], "flag ") {
		if err := oneFabricPort(setting); err != nil {
			return err
		}
	}
	switch {
	case c.name == "bench":
		// bench measures a fabric of its own unless its command line
		// names one: the settings that point clients at a live fabric
		// would have it open its agents there and run its turns, counted
		// in that fabric's usage for good.
		if src := l.from["nats"]; src != "" && !strings.HasPrefix(src, "flag ") {
			if err := fs.Set("nats", ""); err != nil {
				return err
			}
			delete(l.from, "nats")
		}
		return nil
	case c.name == "up":
		url, src := setting("nats")
		if url == "" || layer(l.from["port"]) >= layer(src) || strings.HasPrefix(l.from["nats"], "flag ") {
			// Nothing said, or a port said where the nats was, or later
			// (--port, SHOAL_PORT over a file's nats), says where it
			// listens, or --nats names an external server.
			return nil
		}
		u, err := neturl.Parse(url)
		if err != nil || u.Port() == "" {
			return usagef("%s: nats = %q names no port for shoal up to listen on (an external NATS server is named with --nats on shoal up's command line)", src, url)
		}
		switch u.Scheme {
		case "nats":
		case "tls":
			if f := fs.Lookup("tls-cert"); f == nil || f.Value.String() == "" {
				return usagef("%s: nats = %q asks for TLS: give shoal up --tls-cert and --tls-key, or name the server nats://", src, url)
			}
		default:
			return usagef("%s: nats = %q: shoal up listens at a nats:// or tls:// address", src, url)
		}
		if err := fs.Set("port", u.Port()); err != nil {
			return usagef("%s: nats = %q: %v", src, url, err)
		}
		l.from["port"] = src + " (nats)"
		// Where it listens, too: one setting serves both sides (an
		// address off loopback needs --auth, as --host does).
		if h := u.Hostname(); h != "" && l.from["host"] == "" && fs.Lookup("host") != nil {
			if err := fs.Set("host", h); err != nil {
				return usagef("%s: nats = %q: %v", src, url, err)
			}
			l.from["host"] = src + " (nats)"
		}
	case layer(l.from["nats"]) < layer(portFrom):
		// No nats, or one a later place overrides with a port (SHOAL_PORT
		// over a file's nats): the port shoal up listens on is dialled.
		port, src := setting("port")
		n, err := strconv.Atoi(port)
		switch {
		case err != nil || n < -1 || n > 65535:
			return usagef("%s: port = %q is not a port number", src, port)
		case n <= 0:
			return nil // any free port: nothing a client could dial
		}
		host, _ := setting("host")
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		if err := fs.Set("nats", "nats://"+net.JoinHostPort(host, port)); err != nil {
			return err
		}
		l.from["nats"] = src + " (port)"
	}
	// A nats a client took from the config file or the environment is
	// named as such when it is wrong: --nats was never given.
	if src := l.from["nats"]; src != "" && !strings.HasPrefix(src, "flag ") && c.name != "up" {
		if raw, why := badNatsURL(fs.Lookup("nats").Value.String()); why != "" {
			return usagef("%s: nats = %q: %s", src, raw, why)
		}
	}
	return nil
}

// oneFabricPort refuses a port and a nats that one place (the config
// file, or the environment) gives with different ports: shoal up would
// listen on the port and its clients dial the nats, each taking the
// setting it reads first. Naming the same port (the nats's host may be
// a name clients reach shoal up by), they are one setting. A nats of
// several servers agrees when one of them has the port.
func oneFabricPort(setting func(name string) (value, from string)) error {
	port, portFrom := setting("port")
	url, natsFrom := setting("nats")
	if portFrom == "" || natsFrom == "" || layer(portFrom) != layer(natsFrom) {
		return nil
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return nil // the port's own check names it
	}
	for _, raw := range strings.Split(url, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw // host:port, as clients take it
		}
		u, err := neturl.Parse(raw)
		if err != nil {
			continue
		}
		p := u.Port()
		if p == "" {
			p = "4222" // a client's default
		}
		if p == strconv.Itoa(n) {
			return nil
		}
	}
	why := "name different ports: shoal up would listen on the port and its clients dial the nats; give one of them, or both with the same port"
	if layer(portFrom) == 2 {
		return usagef("environment %s=%s and %s=%q %s", strings.TrimPrefix(portFrom, "env "), port, strings.TrimPrefix(natsFrom, "env "), url, why)
	}
	return usagef("%s: port = %s and nats = %q %s", portFrom, port, url, why)
}

// canonical is the flag an old spelling stands for, else name itself.
func (c *command) canonical(name string) string {
	if n := c.renamed(name); n != "" {
		return n
	}
	return name
}

// applyEnv sets the command's settings from SHOAL_<NAME>, an old name
// first so that the new one wins.
func (c *command) applyEnv(fs *flag.FlagSet, getenv func(string) string, from map[string]string) error {
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if c.isSetting(f.Name) {
			names = append(names, f.Name)
		}
	})
	for _, name := range names {
		for _, v := range append(c.oldNames(name), name) {
			env := "SHOAL_" + envName(v)
			val, ok := lookupEnv(getenv, env)
			if !ok {
				continue
			}
			if err := fs.Set(name, val); err != nil {
				return usagef("environment %s=%q: %s", env, val, setError(fs.Lookup(name), err))
			}
			from[name] = "env " + env
		}
	}
	return nil
}

// oldNames are the old spellings of the command's flag name.
func (c *command) oldNames(name string) []string {
	var out []string
	for old, n := range renamedFlags[c.name] {
		if n == name {
			out = append(out, old)
		}
	}
	sort.Strings(out)
	return out
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

// applyFile sets the command's settings from a flat TOML file and reports
// whether the file was there. A missing file is an error only when it was
// asked for. A key that is no command's setting is an error; settings of
// other commands are ignored, so one file serves every command.
func (c *command) applyFile(fs *flag.FlagSet, path string, explicit bool, l *loaded) (bool, error) {
	from := l.from
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return false, nil
		}
		return false, usagef("config file %s: %v", path, pathless(err))
	}
	var values map[string]any
	defer func() { l.file = values }()
	if _, err := toml.Decode(string(raw), &values); err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return true, usagef("config file %s: line %d: %s", path, perr.Position.Line, perr.Message)
		}
		return true, usagef("config file %s: %v", path, err)
	}
	known := allSettings()
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	// An old spelling first, so that the new one wins.
	sort.Slice(keys, func(i, j int) bool {
		if oi, oj := c.renamed(keys[i]) != "", c.renamed(keys[j]) != ""; oi != oj {
			return oi
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		v := values[k]
		if _, ok := v.(map[string]any); ok {
			return true, usagef("config file %s: [%s]: tables are not used; write flat keys named like the flags", path, k)
		}
		if !known[k] {
			if allFlags()[k] {
				return true, usagef("config file %s: %q is not a setting: give --%s on the command line", path, k, k)
			}
			return true, usagef("config file %s: unknown setting %q%s", path, k, didYouMean(k, sortedKeys(known), ""))
		}
		name := c.canonical(k)
		if fs.Lookup(name) == nil || !c.isSetting(name) {
			continue
		}
		if err := fs.Set(name, fileValue(v)); err != nil {
			return true, usagef("config file %s: %s = %q: %s", path, k, fileValue(v), setError(fs.Lookup(name), err))
		}
		from[name] = "config file " + path
	}
	return true, nil
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

// allSettings is every setting of every command, and the old spellings
// they are still read by.
func allSettings() map[string]bool {
	names := map[string]bool{}
	for _, c := range commands() {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if c.isSetting(f.Name) {
				names[f.Name] = true
				for _, old := range c.oldNames(f.Name) {
					names[old] = true
				}
			}
		})
	}
	return names
}

// allFlags is every flag of every command.
func allFlags() map[string]bool {
	names := map[string]bool{}
	for _, c := range commands() {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(fs)
		fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	}
	return names
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (c *command) flagError(fs *flag.FlagSet, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name := strings.TrimLeft(rest, "-")
		if f, known := valueFlags[name]; known && fs.Lookup(f) != nil {
			// A value of a flag, given as a flag of its own.
			msg = "unknown flag --" + rest + "; did you mean --" + f + " " + name + "?"
		} else {
			msg = "unknown flag --" + rest + didYouMean(rest, c.visibleFlags(fs), "--")
		}
	}
	// The flag package names a flag with one dash; Shoal's are said with
	// two, as its help writes them.
	if v, rest, ok := strings.Cut(msg, " for flag -"); ok && strings.HasPrefix(v, "invalid ") {
		name, why, _ := strings.Cut(strings.TrimLeft(rest, "-"), ": ")
		if f := fs.Lookup(name); f != nil && (why == "parse error" || why == "value out of range") {
			why = setError(f, errors.New(why))
		}
		msg = v + " for flag --" + name + ": " + why
	}
	return usagef("%s (see %s --help)", msg, fs.Name())
}

// valueFlags are values people give as flags of their own (shoal tail
// --new), and the flag they are a value of.
var valueFlags = map[string]string{"new": "from", "start": "from"}

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
	// 2h rather than 2h0m0s.
	s := v.d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}

// Set reads a duration, which is never negative: a flag's "never" is 0,
// and a negative one read as that, or as at once (a watchdog's grace),
// would say nothing of the mistake.
func (v durationValue) Set(s string) error {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n != n {
			return fmt.Errorf("%q is not a duration (e.g. 90s, 12h, 7d)", s)
		}
		d = time.Duration(n * float64(24*time.Hour))
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("%q is not a duration (e.g. 90s, 12h, 7d)", s)
		}
	}
	if d < 0 {
		return fmt.Errorf("%q is negative: a duration is 0 or more", s)
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
