package deploy_test

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// unitFile is a parsed systemd unit: its sections in order, each with its
// settings in order (a key may repeat, as systemd allows).
type unitFile struct {
	sections []string
	settings map[string][]setting
}

type setting struct {
	key, value string
	line       int
}

// get returns the one value of key in section, or fails the test.
func (u *unitFile) get(t *testing.T, name, section, key string) string {
	t.Helper()
	var vals []string
	for _, s := range u.settings[section] {
		if s.key == key {
			vals = append(vals, s.value)
		}
	}
	if len(vals) != 1 {
		t.Errorf("%s: [%s] %s is set %d times, want once", name, section, key, len(vals))
		return ""
	}
	return vals[0]
}

var unitKey = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

// parseUnit reads a unit the way systemd does (systemd.syntax(7)): blank
// lines and lines starting with # or ; are comments, [Section] starts a
// section, every other line is Key=Value inside a section, and a line
// ending in a backslash continues on the next.
func parseUnit(text string) (*unitFile, error) {
	u := &unitFile{settings: map[string][]setting{}}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		start := n
		for strings.HasSuffix(line, `\`) && sc.Scan() {
			n++
			// The backslash becomes a space, as systemd reads it.
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(sc.Text())
		}
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: a section header without its ]: %q", start, line)
			}
			section = line[1 : len(line)-1]
			if slices.Contains(u.sections, section) {
				return nil, fmt.Errorf("line %d: section [%s] again", start, section)
			}
			u.sections = append(u.sections, section)
		default:
			key, value, ok := strings.Cut(line, "=")
			key, value = strings.TrimSpace(key), strings.TrimSpace(value)
			switch {
			case !ok:
				return nil, fmt.Errorf("line %d: neither a section nor Key=Value: %q", start, line)
			case section == "":
				return nil, fmt.Errorf("line %d: %s before any section", start, key)
			case !unitKey.MatchString(key):
				return nil, fmt.Errorf("line %d: %q is not a key", start, key)
			}
			u.settings[section] = append(u.settings[section], setting{key, value, start})
		}
	}
	return u, sc.Err()
}

// The settings these units may use, by section: a misspelt key is one
// systemd ignores with a warning, so the unit would silently lose it.
var unitKeys = map[string][]string{
	"Unit":    {"Description", "Documentation", "After", "Before", "Wants", "Requires", "BindsTo", "PartOf", "ConditionPathExists"},
	"Service": {"Type", "User", "Group", "WorkingDirectory", "Environment", "EnvironmentFile", "ExecStartPre", "ExecStart", "ExecStop", "ExecReload", "Restart", "RestartSec", "KillSignal", "KillMode", "TimeoutStopSec", "TimeoutStartSec", "LimitNOFILE"},
	"Install": {"WantedBy", "RequiredBy", "Alias"},
}

// The systemd units parse: [Unit], [Service] and [Install] in that order,
// only settings systemd knows in each, values it accepts, and an
// ExecStart that runs `shoal up` for the coordinator and `shoal node` for
// a node.
func TestSystemdUnits(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("systemd/*.service")
	if err != nil {
		t.Fatal(err)
	}
	verbs := map[string]string{"shoal-coordinator.service": "up", "shoal-node.service": "node"}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"shoal-coordinator.service", "shoal-node.service"}) {
		t.Fatalf("deploy/systemd has %v, want the coordinator's and the node's units", names)
	}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join("systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		u, err := parseUnit(string(b))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !slices.Equal(u.sections, []string{"Unit", "Service", "Install"}) {
			t.Errorf("%s: sections %v, want [Unit Service Install]", name, u.sections)
		}
		for section, settings := range u.settings {
			for _, s := range settings {
				if !slices.Contains(unitKeys[section], s.key) {
					t.Errorf("%s:%d: [%s] has %s, which systemd would ignore", name, s.line, section, s.key)
				}
				if s.value == "" {
					t.Errorf("%s:%d: %s is empty", name, s.line, s.key)
				}
			}
		}

		if u.get(t, name, "Unit", "Description") == "" {
			t.Errorf("%s: no Description", name)
		}
		for _, key := range []string{"After", "Wants"} {
			if v := u.get(t, name, "Unit", key); !slices.Contains(strings.Fields(v), "network-online.target") {
				t.Errorf("%s: %s=%s does not wait for the network", name, key, v)
			}
		}

		exec := strings.Fields(u.get(t, name, "Service", "ExecStart"))
		if len(exec) < 2 || !path.IsAbs(exec[0]) || path.Base(exec[0]) != "shoal" || exec[1] != verbs[name] {
			t.Errorf("%s: ExecStart=%s, want an absolute path to shoal and then %q", name, strings.Join(exec, " "), verbs[name])
		}
		if user := u.get(t, name, "Service", "User"); user == "" || user == "root" {
			t.Errorf("%s: User=%s, want an unprivileged user", name, user)
		}
		envFile := strings.TrimPrefix(u.get(t, name, "Service", "EnvironmentFile"), "-")
		if !path.IsAbs(envFile) {
			t.Errorf("%s: EnvironmentFile=%s is not an absolute path", name, envFile)
		}
		if v := u.get(t, name, "Service", "Restart"); !slices.Contains([]string{"on-failure", "always", "on-abnormal"}, v) {
			t.Errorf("%s: Restart=%s does not restart a crashed shoal", name, v)
		}
		for _, key := range []string{"RestartSec", "TimeoutStopSec"} {
			if _, err := timeSpan(u.get(t, name, "Service", key)); err != nil {
				t.Errorf("%s: %s: %v", name, key, err)
			}
		}
		// shoal closes its agents on SIGTERM, and its agents are children in
		// its cgroup, which systemd should reap with it.
		if v := u.get(t, name, "Service", "KillSignal"); v != "SIGTERM" {
			t.Errorf("%s: KillSignal=%s, want SIGTERM", name, v)
		}
		if v := u.get(t, name, "Service", "KillMode"); v != "control-group" {
			t.Errorf("%s: KillMode=%s, want control-group", name, v)
		}
		if stop, err := timeSpan(u.get(t, name, "Service", "TimeoutStopSec")); err == nil && stop < 10*time.Second {
			t.Errorf("%s: TimeoutStopSec=%s leaves shoal no time to close its agents", name, stop)
		}
		if v := u.get(t, name, "Install", "WantedBy"); v != "multi-user.target" {
			t.Errorf("%s: WantedBy=%s, want multi-user.target", name, v)
		}
	}
}

// timeSpan reads a systemd time span: plain seconds, or a number with a
// unit (500ms, 2s, 1min, 1h; several may follow one another).
func timeSpan(v string) (time.Duration, error) {
	if v == "" {
		return 0, fmt.Errorf("an empty time span")
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	span := regexp.MustCompile(`^(\d+)\s*(us|ms|s|sec|m|min|h|hr)$`)
	var total time.Duration
	for _, part := range strings.Fields(v) {
		m := span.FindStringSubmatch(part)
		if m == nil {
			return 0, fmt.Errorf("%q is not a time span", v)
		}
		n, _ := strconv.Atoi(m[1])
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "sec": time.Second,
			"m": time.Minute, "min": time.Minute, "h": time.Hour, "hr": time.Hour}[m[2]]
		total += time.Duration(n) * unit
	}
	return total, nil
}

// The parser itself refuses what systemd would not read as intended.
func TestParseUnitRefuses(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"Description=before any section\n[Unit]\n",
		"[Unit\nDescription=x\n",
		"[Unit]\nDescription x\n",
		"[Unit]\nDescription=x\n[Unit]\nAfter=y\n",
		"[Service]\nExec Start=/usr/local/bin/shoal up\n",
	} {
		if _, err := parseUnit(bad); err == nil {
			t.Errorf("parseUnit accepted %q", bad)
		}
	}
	u, err := parseUnit("# c\n; c\n[Service]\nExecStart=/usr/local/bin/shoal \\\n  node --max-agents 4\n")
	if err != nil || len(u.settings["Service"]) != 1 || strings.Join(strings.Fields(u.settings["Service"][0].value), " ") != "/usr/local/bin/shoal node --max-agents 4" {
		t.Errorf("a continued line: %+v %v", u, err)
	}
}
