package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// escapeRun is one run of the escape battery: its label, the sandbox it
// ran in, and each attack's verdict in the battery's order.
type escapeRun struct {
	label   string
	order   []string
	escaped map[string]string // attack → detail, for the attacks that escaped
}

// proxyNames are the host names the sandboxes may reach through their
// proxies; a private /etc/hosts makes each resolve to this machine.
var proxyNames = []string{"name-loop.shoal.test", "name-v6.shoal.test", "name-zero.shoal.test"}

// escapeAttacks says in a few words what each attack of the battery
// tries, in its order: docs/sandbox.md's table is made of them and of a
// run's verdicts, and an attack without words here fails the test.
var escapeAttacks = [][2]string{
	{"read_outside_file", "read a secret file outside the working directory"},
	{"read_ssh_key", "read a private key in the user's home"},
	{"read_etc_shadow", "read /etc/shadow (root may read it by owner rights)"},
	{"read_symlink_in_work", "plant a symlink to the secret in the working directory and read through it"},
	{"read_dotdot", "read the secret through ../ from the working directory"},
	{"read_proc_self_root", "read the secret through /proc/self/root"},
	{"read_proc_1_root", "read the secret through pid 1's /proc/1/root"},
	{"read_proc_environ", "read another process's environment through /proc/<pid>/environ"},
	{"read_inherited_env", "find a secret of the caller's environment in its own"},
	{"read_other_pts", "read another terminal's input from /dev/pts/N"},
	{"read_block_device", "read a raw block device"},
	{"read_mem_kcore", "read /dev/mem, /dev/kmem, /dev/port or /proc/kcore"},
	{"read_kernel_log", "read a marker from the kernel log (syslog(2), /dev/kmsg)"},
	{"read_sysv_shm", "attach the host's System V shared memory segment"},
	{"read_posix_mq", "receive from the host's POSIX message queue"},
	{"read_keyring_user", "read a key from the user's keyring"},
	{"read_keyring_session", "read a key from the caller's session keyring"},
	{"read_keyring_user_via_s", "read the user keyring's key through the session keyring"},
	{"read_by_file_handle", "open the secret by file handle (open_by_handle_at), around the mount view"},
	{"read_inherited_socket_fd", "read a live socket to a host service left open by the caller"},
	{"write_outside_dir", "write a file outside the working directory"},
	{"write_root_home", "write a file in the user's home"},
	{"write_tmp", "write a file in the host's /tmp"},
	{"write_dev_shm", "write a file in the host's /dev/shm"},
	{"write_npm_logs", "write a file in ~/.npm/_logs"},
	{"write_symlink_in_work", "write outside through a symlink planted in the working directory"},
	{"write_dotdot", "write outside through ../"},
	{"write_proc_self_root", "write outside through /proc/self/root"},
	{"write_rename_out", "rename a file out of the working directory"},
	{"write_hardlink_out", "hardlink a file outside into the working directory and append to it"},
	{"chmod_outside", "change the mode of a file outside"},
	{"touch_outside", "change the modification time of a file outside"},
	{"xattr_outside", "set an extended attribute on a file outside"},
	{"chmod_suid_root", "leave a setuid-root binary behind (chown 0, chmod 4755)"},
	{"mknod_block_device", "create a block device node"},
	{"userns_remount_write", "in a new user and mount namespace, remount the outside writable and write"},
	{"write_inherited_dir_fd", "write outside through a directory descriptor left open by the caller"},
	{"ptrace_pid1", "ptrace pid 1"},
	{"ptrace_host_victim", "ptrace a process of the host's"},
	{"proc_mem_less_filtered", "open the memory of a less confined process through /proc/<pid>/mem"},
	{"io_uring_setup", "make an io_uring (whose operations go around the system call filter)"},
	{"bpf_load", "load a BPF program or make a BPF map"},
	{"mount_tmpfs", "mount a file system"},
	{"unshare_userns", "make a new user namespace"},
	{"setns_foreign", "enter another process's namespace"},
	{"keyctl_add_key", "add a key to the user's keyring"},
	{"tiocsti_inject", "push input into a terminal (TIOCSTI)"},
	{"sethostname_host", "set the host's name"},
	{"shares_host_netns", "share the host's network namespace"},
	{"shares_host_mntns", "share the host's mount namespace"},
	{"shares_host_pidns", "share the host's pid namespace"},
	{"shares_host_userns", "share the host's user namespace"},
	{"shares_host_ipcns", "share the host's IPC namespace"},
	{"shares_host_utsns", "share the host's UTS namespace"},
	{"shares_host_cgroupns", "share the host's cgroup namespace"},
	{"daemon_setsid", "leave a daemon running after the sandbox ends (setsid env -i sleep &)"},
	{"daemon_doublefork", "leave a double-forked daemon that ignores SIGTERM and SIGHUP"},
	{"tcp_host_loopback_v4", "connect to a service on the host's 127.0.0.1"},
	{"tcp_host_loopback_v6", "connect to a service on the host's ::1"},
	{"tcp_fastopen_loopback", "reach it with TCP Fast Open (connect and send in one call)"},
	{"udp_host_loopback", "exchange a datagram with a UDP service on the host's loopback"},
	{"unix_socket_outside", "connect to a unix socket outside by its path"},
	{"unix_abstract_outside", "connect to an abstract unix socket of the host's"},
	{"icmp_route_outside", "route ICMP to an outside address"},
	{"raw_socket_outside", "open a raw socket with a route outside"},
	{"packet_socket", "open a packet socket with a network interface to it"},
	{"udp_route_outside_v4", "have a route for UDP to an outside IPv4 address"},
	{"udp_route_outside_v6", "have a route for UDP to an outside IPv6 address"},
	{"udp_route_dns_resolver", "have a route to the host's DNS resolver"},
	{"dns_direct_lookup", "resolve a public name without the proxy"},
	{"tcp_direct_registry", "connect to a public host without the proxy"},
	{"proxy_connect_127", "CONNECT through the proxy to 127.0.0.1"},
	{"proxy_connect_localhost", "CONNECT through the proxy to localhost"},
	{"proxy_connect_v6_loop", "CONNECT through the proxy to [::1]"},
	{"proxy_connect_v4mapped", "CONNECT through the proxy to [::ffff:127.0.0.1]"},
	{"proxy_connect_decimal", "CONNECT through the proxy to 2130706433 (127.0.0.1 as one number)"},
	{"proxy_connect_hex", "CONNECT through the proxy to 0x7f000001"},
	{"proxy_connect_octal", "CONNECT through the proxy to 0177.0.0.1"},
	{"proxy_connect_short", "CONNECT through the proxy to 127.1"},
	{"proxy_connect_zero", "CONNECT through the proxy to 0.0.0.0"},
	{"proxy_connect_dot", "CONNECT through the proxy to localhost."},
	{"proxy_connect_sub_lh", "CONNECT through the proxy to x.localhost"},
	{"proxy_connect_hostname", "CONNECT through the proxy to the machine's own host name"},
	{"proxy_get_absolute", "GET http://127.0.0.1/ through the proxy"},
	{"proxy_get_userinfo", "GET http://allowed.name@127.0.0.1/ through the proxy"},
	{"proxy_get_localhost", "GET http://localhost/ through the proxy"},
	{"proxy_connect_name_loop", "CONNECT through the proxy to an allowed name that resolves to 127.0.0.1"},
	{"proxy_connect_name_v6", "CONNECT through the proxy to an allowed name that resolves to ::1"},
	{"proxy_connect_name_zero", "CONNECT through the proxy to an allowed name that resolves to 0.0.0.0"},
	{"proxy_get_name_loop", "GET through the proxy from an allowed name that resolves to 127.0.0.1"},
	{"socks_name_loop", "SOCKS5 to an allowed name that resolves to 127.0.0.1"},
	{"socks_ip_127", "SOCKS5 to 127.0.0.1"},
	{"socks_domain_localhost", "SOCKS5 to localhost"},
	{"socks_domain_hostname", "SOCKS5 to the machine's own host name"},
	{"reach_kaimon_bus", "connect to Shoal's Kaimon bus socket"},
	{"reach_nats_port", "connect to Shoal's NATS port"},
	{"reach_mcp_port", "connect to Shoal's MCP endpoint directly (not through the proxy)"},
	{"write_ancestor_stdout", "open the agent CLI's standard output for writing (to forge its events)"},
	{"inherited_fds", "hold any descriptor above 2 that the caller left open"},
}

// The escape battery (testdata/escape) runs the same attacks four ways,
// each from inside, as root, with descriptors, environment, a terminal
// and a session keyring of the caller's to steal: with no sandbox (the
// battery's self-test), under srt (bubblewrap), and from the Bash tool of
// a sandboxed real claude agent of Shoal's, with namespaces and with
// Landlock alone. Shoal with namespaces refuses every attack, so at least
// everything srt refuses; docs/sandbox.md holds the table of this run
// (go test -run TestEscapeBattery -update rewrites it).
func TestEscapeBattery(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Fatal("the escape battery runs as root (it plants a root-owned key ring, reads /etc/shadow and sets up a private /etc/hosts); run it as root, as .ci/run does")
	}
	for _, tool := range []string{"bwrap", "socat", "rg", "script", "pgrep", "unshare", "/usr/bin/python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the escape battery needs %s, which scripts/test installs: %v", tool, err)
		}
	}
	srt := peers.SandboxRuntime.Command(t)
	claude := peers.Claude.Command(t)[0]

	lab := t.TempDir()
	if d := os.Getenv("ESCAPE_KEEP"); d != "" {
		lab = d
	}
	copyDir(t, filepath.Join("testdata", "escape"), lab)
	work := filepath.Join(lab, "work")
	home := filepath.Join(lab, "home")
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	hosts = fmt.Appendf(hosts, "\n127.0.0.1 %s\n::1 %s\n0.0.0.0 %s\n", proxyNames[0], proxyNames[1], proxyNames[2])
	writeFile(t, filepath.Join(lab, "hosts"), string(hosts))
	settings, _ := json.Marshal(map[string]any{
		"network":    map[string]any{"allowedDomains": proxyNames, "deniedDomains": []string{}},
		"filesystem": map[string]any{"denyRead": []string{}, "allowRead": []string{}, "allowWrite": []string{work}, "denyWrite": []string{}},
	})
	writeFile(t, filepath.Join(lab, "srt-settings.json"), string(settings))

	// The model behind every claude agent: the prompt is the command to
	// run; it answers with a Bash call of it, then with "done".
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		if len(r.ToolResults) > 0 || !strings.Contains(r.UserText, "battery.sh") {
			return fakemodel.Reply{Text: "done"}
		}
		in, _ := json.Marshal(map[string]any{"command": r.UserText, "description": "run the escape battery", "timeout": 600000})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}})
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), baseEnv(home)...)
	env = append(env, "LAB="+lab, "HOSTHOME="+home, "SHOAL="+os.Args[0], "CLAUDE="+claude, "NAMES="+strings.Join(proxyNames, " "))

	up := filepath.Join(lab, "shoal-up.sh")
	runs := []struct {
		label  string
		prefix []string
	}{
		{"none", []string{up, "beside"}},
		{"srt", append(append([]string{up, "beside"}, srt...), "--settings", filepath.Join(lab, "srt-settings.json"))},
		{"shoal", []string{up, "inside", "namespaces"}},
		{"shoal-landlock", []string{up, "inside", "landlock"}},
	}
	results := map[string]*escapeRun{}
	for _, r := range runs {
		results[r.label] = runBattery(t, lab, env, r.label, r.prefix)
	}

	none, srtRun, shoal := results["none"], results["srt"], results["shoal"]
	if len(none.escaped) < len(none.order)/2 {
		t.Errorf("with no sandbox only %d of %d attacks escaped: the battery has lost its teeth", len(none.escaped), len(none.order))
	}
	for _, name := range shoal.order {
		if detail, ok := shoal.escaped[name]; ok {
			t.Errorf("%s escaped Shoal's sandbox: %s", name, detail)
		}
	}
	for _, name := range srtRun.order {
		if _, ok := srtRun.escaped[name]; !ok && !slices.Contains(shoal.order, name) {
			t.Errorf("%s, refused by srt, did not run in Shoal's sandbox", name)
		}
	}
	names := make([]string, len(escapeAttacks))
	for i, a := range escapeAttacks {
		names[i] = a[0]
	}
	for _, r := range runs {
		if got := results[r.label].order; !slices.Equal(got, names) {
			t.Errorf("the run %s made the attacks %v; escapeAttacks lists %v", r.label, got, names)
		}
	}
	columns := [][2]string{{"none", "No sandbox"}, {"srt", "srt " + peers.SandboxRuntime.Version}, {"shoal", "Shoal"}, {"shoal-landlock", "Shoal, Landlock alone"}}
	checkGenerated(t, filepath.Join("..", "..", "docs", "sandbox.md"), "escape battery", escapeTable(columns, results))
}

var update = flag.Bool("update", false, "rewrite what tests generate into the docs from this run")

// escapeTable is the Markdown table of the runs, one row per attack and
// one column per run, with the count of escapes at the foot.
func escapeTable(columns [][2]string, results map[string]*escapeRun) string {
	var b strings.Builder
	b.WriteString("| Attack | What it tries |")
	for _, c := range columns {
		b.WriteString(" " + c[1] + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(columns)) + "\n")
	for _, a := range escapeAttacks {
		fmt.Fprintf(&b, "| `%s` | %s |", a[0], a[1])
		for _, c := range columns {
			if _, ok := results[c[0]].escaped[a[0]]; ok {
				b.WriteString(" **escaped** |")
			} else {
				b.WriteString(" refused |")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("| | **Escaped** |")
	for _, c := range columns {
		fmt.Fprintf(&b, " **%d of %d** |", len(results[c[0]].escaped), len(results[c[0]].order))
	}
	b.WriteString("\n")
	return b.String()
}

// checkGenerated holds the part of the doc at path between the markers
// named name to text: with -update it rewrites that part, else it fails
// the test where they differ.
func checkGenerated(t *testing.T, path, name, text string) {
	t.Helper()
	begin := "<!-- begin " + name + ": written by a test from its run (go test -update); do not edit -->\n"
	end := "<!-- end " + name + " -->"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q and %q around the %s", path, begin, end, name)
	}
	if doc[i+len(begin):j] == text {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+text+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the %s in %s", name, path)
		return
	}
	t.Errorf("the %s in %s is not this run's; run the test with -update and review the change. This run:\n%s", name, path, text)
}

// runBattery runs run-battery.sh label -- prefix... in a mount namespace
// of its own whose /etc/hosts is the lab's, and reads its verdicts.
func runBattery(t *testing.T, lab string, env []string, label string, prefix []string) *escapeRun {
	t.Helper()
	args := append([]string{"-m", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`,
		filepath.Join(lab, "hosts"), filepath.Join(lab, "run-battery.sh"), label, "--"}, prefix...)
	cmd := exec.CommandContext(t.Context(), "unshare", args...)
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the battery's run %s: %v\n%s", label, err, out)
	}
	f, err := os.Open(filepath.Join(lab, "results", label+".txt"))
	if err != nil {
		t.Fatalf("the battery's run %s wrote no results: %v\n%s", label, err, out)
	}
	defer f.Close()
	r := &escapeRun{label: label, escaped: map[string]string{}}
	verdict := regexp.MustCompile(`^([a-z0-9_]+): (refused|ESCAPED \((.*)\))$`)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := verdict.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		r.order = append(r.order, m[1])
		if m[2] != "refused" {
			r.escaped[m[1]] = m[3]
		}
	}
	if len(r.order) == 0 {
		errs, _ := os.ReadFile(filepath.Join(lab, "results", label+".err"))
		t.Fatalf("the battery's run %s gave no verdicts:\n%s\n%s", label, out, errs)
	}
	return r
}

// copyDir copies the files of src into dst, keeping their modes.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		info, _ := e.Info()
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
