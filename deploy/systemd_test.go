package deploy_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
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

// all returns every value of key in section, in order.
func (u *unitFile) all(section, key string) []string {
	var vals []string
	for _, s := range u.settings[section] {
		if s.key == key {
			vals = append(vals, s.value)
		}
	}
	return vals
}

// comments are the unit's comment lines, without their #.
func comments(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if c, ok := strings.CutPrefix(strings.TrimSpace(line), "#"); ok {
			b.WriteString(c + "\n")
		}
	}
	return b.String()
}

// Keys whose empty value means something: no capabilities at all.
var emptyMeans = []string{"CapabilityBoundingSet", "AmbientCapabilities"}

// The hardening both units have, with the value each must have.
var hardening = map[string]string{
	"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
	"PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
	"ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "RestrictNamespaces": "yes",
	"LockPersonality": "yes", "RestrictSUIDSGID": "yes", "RestrictRealtime": "yes",
	"CapabilityBoundingSet": "", "AmbientCapabilities": "", "SystemCallArchitectures": "native",
}

var settingLine = regexp.MustCompile(`(?m)^\s+(SHOAL_[A-Z0-9_]+)=`)

// The systemd units: [Unit], [Service] and [Install] in that order; an
// ExecStart that runs `shoal up --no-node` for the coordinator and `shoal
// node` for a node, with flags the binary accepts, as an unprivileged user
// whose state is in the unit's StateDirectory, with settings from an
// environment file whose SHOAL_* variables (those the comments show) the
// binary reads; hardened, with the node still allowed what agents need:
// the Landlock and seccomp system calls its sandbox makes and writable
// executable memory for node.js.
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
	if !slices.Equal(names, []string{"shoal-coordinator.service", "shoal-node.service", "shoal-tunnel.service"}) {
		t.Fatalf("deploy/systemd has %v, want the coordinator's, the node's and the tunnel's units", names)
	}
	for _, name := range names[:2] { // the tunnel runs ssh: TestSystemdTunnel
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
		for _, settings := range u.settings {
			for _, s := range settings {
				if s.value == "" && !slices.Contains(emptyMeans, s.key) {
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
			continue
		}
		if err := accepts(exec[1:]); err != nil {
			t.Errorf("%s: ExecStart: %v", name, err)
		}
		for _, m := range settingLine.FindAllStringSubmatch(comments(string(b)), -1) {
			if !envNames(t, exec[1])[m[1]] {
				t.Errorf("%s: the comments set %s, which shoal %s does not read", name, m[1], exec[1])
			}
		}
		for _, c := range documentedCommands(t, comments(string(b))) {
			if err := accepts(c); err != nil {
				t.Errorf("%s: a command in the comments: %v", name, err)
			}
		}
		// The steps in the header put the binary where ExecStart runs it.
		if !strings.Contains(comments(string(b)), "sudo install -m 0755 shoal "+exec[0]) {
			t.Errorf("%s: no step in the header installs shoal at %s, where ExecStart runs it", name, exec[0])
		}

		user := u.get(t, name, "Service", "User")
		if user == "" || user == "root" {
			t.Errorf("%s: User=%s, want an unprivileged user", name, user)
		}
		// The user's state: the StateDirectory systemd makes for it, where
		// shoal keeps its files ($XDG_DATA_HOME/shoal, or under HOME).
		state := "/var/lib/" + u.get(t, name, "Service", "StateDirectory")
		env := map[string]string{}
		for _, e := range u.all("Service", "Environment") {
			k, v, _ := strings.Cut(e, "=")
			env[k] = v
		}
		switch verbs[name] {
		case "up":
			if env["XDG_DATA_HOME"]+"/shoal" != state {
				t.Errorf("%s: XDG_DATA_HOME=%s, so shoal up keeps its state outside %s", name, env["XDG_DATA_HOME"], state)
			}
			if !slices.Contains(exec, "--no-node") {
				t.Errorf("%s: the coordinator runs agents; they need what its hardening denies", name)
			}
			if v := u.get(t, name, "Service", "MemoryDenyWriteExecute"); v != "yes" {
				t.Errorf("%s: MemoryDenyWriteExecute=%s; a Go program needs no writable executable memory", name, v)
			}
		case "node":
			if env["HOME"] != state {
				t.Errorf("%s: HOME=%s, not its state directory %s, where the agent CLIs keep their logins", name, env["HOME"], state)
			}
			if v := u.all("Service", "MemoryDenyWriteExecute"); len(v) > 0 {
				t.Errorf("%s: MemoryDenyWriteExecute=%v: node.js agents need writable executable memory for their JIT", name, v)
			}
			filter := strings.Fields(strings.Join(u.all("Service", "SystemCallFilter"), " "))
			for _, call := range []string{"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "seccomp"} {
				if !slices.Contains(filter, call) {
					t.Errorf("%s: SystemCallFilter does not allow %s, which the sandbox calls", name, call)
				}
			}
			if len(u.all("Service", "ReadWritePaths")) == 0 {
				t.Errorf("%s: no ReadWritePaths: agents could write no project directory", name)
			}
		}
		if v := u.all("Service", "SystemCallFilter"); len(v) == 0 || v[0] != "@system-service" {
			t.Errorf("%s: SystemCallFilter=%v, want @system-service first", name, v)
		}
		for key, want := range hardening {
			if got := u.get(t, name, "Service", key); got != want {
				t.Errorf("%s: %s=%s, want %s", name, key, got, want)
			}
		}
		families := strings.Fields(u.get(t, name, "Service", "RestrictAddressFamilies"))
		for _, f := range families {
			if !slices.Contains([]string{"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}, f) {
				t.Errorf("%s: RestrictAddressFamilies allows %s", name, f)
			}
		}
		if len(families) == 0 {
			t.Errorf("%s: RestrictAddressFamilies is not set", name)
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

// systemdAnalyze runs systemd-analyze, which these tests need: they fail,
// never skip, where it is missing.
func systemdAnalyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is not installed; it checks the systemd units (Debian: apt-get install systemd, which scripts/test installs)")
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

var exposure = regexp.MustCompile(`Overall exposure level for (\S+): (\d+\.\d+) `)

// systemd-analyze rates both units' exposure below 5 (of 10), and
// verifies them without a word: every key known, every value valid,
// every command there.
func TestSystemdAnalyze(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"shoal-coordinator.service", "shoal-node.service"} {
		unit := filepath.Join("systemd", name)
		out, err := systemdAnalyze(t, "security", "--offline=true", unit)
		m := exposure.FindStringSubmatch(out)
		if m == nil || m[1] != name {
			t.Errorf("systemd-analyze security %s: %v, no exposure level for it:\n%s", name, err, out)
		} else if score, _ := strconv.ParseFloat(m[2], 64); score >= 5.0 {
			t.Errorf("systemd-analyze security rates %s %s, want below 5.0:\n%s", name, m[2], out)
		}

		// verify checks that ExecStart's binary exists: point it at the
		// one built from this repository.
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		copied := filepath.Join(dir, name)
		text := strings.ReplaceAll(string(b), "ExecStart=/usr/local/bin/shoal ", "ExecStart="+shoalBin+" ")
		if err := os.WriteFile(copied, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := systemdAnalyze(t, "verify", copied); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
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

// The tunnel unit forwards the coordinator's NATS and MCP ports to this
// machine's loopback over SSH, failing (and restarting) rather than
// running without its forwards, and systemd-analyze verifies it.
func TestSystemdTunnel(t *testing.T) {
	t.Parallel()
	name := "shoal-tunnel.service"
	unit := filepath.Join("systemd", name)
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	u, err := parseUnit(string(b))
	if err != nil {
		t.Fatal(err)
	}
	exec := strings.Fields(u.get(t, name, "Service", "ExecStart"))
	for _, want := range []string{"-N", "BatchMode=yes", "ExitOnForwardFailure=yes", "127.0.0.1:4222:127.0.0.1:4222", "127.0.0.1:7270:127.0.0.1:7270", "${SHOAL_TUNNEL}"} {
		if !slices.Contains(exec, want) {
			t.Errorf("%s: ExecStart has no %s: %v", name, want, exec)
		}
	}
	if exec[0] != "/usr/bin/ssh" || u.get(t, name, "Service", "Restart") != "always" || u.get(t, name, "Service", "User") != "shoal-node" {
		t.Errorf("%s: ExecStart %s, Restart %s, User %s", name, exec[0], u.get(t, name, "Service", "Restart"), u.get(t, name, "Service", "User"))
	}
	if out, err := systemdAnalyze(t, "verify", unit); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
	}
}
