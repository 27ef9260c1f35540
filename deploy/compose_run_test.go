package deploy_test

import (
	"bufio"
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/shoalfabric/shoal/internal/freeport"
)

// container stands in for one compose service's container: its own
// filesystem under root, where each mount is a link to a directory shared
// by the containers that mount the same volume.
type container struct {
	root  string
	ports map[string]string // container port → the loopback port standing in for it
	hosts []string          // the names that resolve to a container
}

// path maps a container path onto the host.
func (c *container) path(p string) string { return filepath.Join(c.root, p) }

// mount links the container path target to the host directory dir.
func (c *container) mount(target, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.path(target)), 0o755); err != nil {
		return err
	}
	return os.Symlink(dir, c.path(target))
}

var hostPort = regexp.MustCompile(`^([a-z-]+://)?([A-Za-z0-9.-]+):(\d+)(/.*)?$`)

// arg maps one command-line argument: container paths onto the host,
// every listen address and service name onto the host's loopback, and
// container ports onto the ports standing in for them.
func (c *container) arg(a, prev string) string {
	switch {
	case prev == "--port" && c.ports[a] != "":
		return c.ports[a]
	case a == "0.0.0.0":
		return "127.0.0.1"
	case path.IsAbs(a):
		return c.path(a)
	}
	if m := hostPort.FindStringSubmatch(a); m != nil && (m[2] == "0.0.0.0" || slices.Contains(c.hosts, m[2])) {
		port := m[3]
		if p := c.ports[port]; p != "" {
			port = p
		}
		return m[1] + "127.0.0.1:" + port + m[4]
	}
	return a
}

// command is argv run as the container runs it: by the image's entrypoint
// (the shoal binary built here) in its working directory, with the
// image's environment and the service's.
func (c *container) command(img *image, s types.ServiceConfig, argv []string) *exec.Cmd {
	var args []string
	for i, a := range argv {
		prev := ""
		if i > 0 {
			prev = argv[i-1]
		}
		args = append(args, c.arg(a, prev))
	}
	cmd := exec.Command(shoalBin, args...)
	cmd.Dir = c.path(img.workdir)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + c.path("/home/"+img.user)}
	for k, v := range img.env {
		cmd.Env = append(cmd.Env, k+"="+c.arg(v, ""))
	}
	for k, v := range s.Environment {
		if v != nil {
			cmd.Env = append(cmd.Env, k+"="+*v)
		}
	}
	return cmd
}

// running is a long-running service's process.
type running struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer
	done   chan struct{}
}

func startRunning(t *testing.T, name string, cmd *exec.Cmd) *running {
	t.Helper()
	r := &running{cmd: cmd, lines: make(chan string, 64), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	go func() {
		cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		// shoal stops cleanly on SIGTERM, as `docker compose down` asks.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-r.done
			t.Errorf("%s did not stop on SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("%s wrote on stderr:\n%s", name, r.stderr)
		}
	})
	return r
}

// waitLine waits for a line that starts with prefix.
func (r *running) waitLine(t *testing.T, name, prefix string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				<-r.done
				t.Fatalf("%s exited before printing %q: %v\n%s", name, prefix, r.cmd.ProcessState, r.stderr)
			}
			if strings.HasPrefix(l, prefix) {
				go func() {
					for range r.lines {
					}
				}()
				return
			}
		case <-deadline:
			r.cmd.Process.Kill()
			<-r.done
			t.Fatalf("%s did not print %q in a minute:\n%s", name, prefix, r.stderr)
		}
	}
}

// ready is the line each long-running command prints once it is up.
var ready = map[string]string{"up": "shoal: ready", "node": "shoal: node "}

func freePort(t *testing.T) string { return strconv.Itoa(freeport.Take(t)) }

// startOrder is the services in the order compose starts them: each
// after what it depends on.
func startOrder(t *testing.T, p *types.Project) []string {
	t.Helper()
	var order []string
	placed := map[string]bool{}
	names := p.ServiceNames()
	slices.Sort(names)
	for len(order) < len(names) {
		progress := false
		for _, n := range names {
			if placed[n] {
				continue
			}
			ok := true
			for dep := range p.Services[n].DependsOn {
				ok = ok && placed[dep]
			}
			if ok {
				order, placed[n], progress = append(order, n), true, true
			}
		}
		if !progress {
			t.Fatalf("compose.yaml's dependencies have a cycle: placed %v", order)
		}
	}
	return order
}

// compose.yaml's services, run as its containers would run them (each
// command line as written, on the image's environment, its volumes
// shared directories, its addresses the host's loopback), come up and
// work together: the credential steps issue what the nodes join with,
// both nodes join the coordinator with them, a client with credentials
// issued as the file's header says sees both nodes while an anonymous
// one is refused, the MCP endpoint answers only with the token, and the
// coordinator's store and keys and the nodes' files land in their
// volumes. Docker itself (the image, its ownership of fresh volumes, the
// port forwarding) is what TestComposeConfig checks by reading.
func TestComposeRuns(t *testing.T) {
	t.Parallel()
	project := mustLoadCompose(t)
	img := mustParseDockerfile(t)
	dir := t.TempDir()
	ports := map[string]string{}
	for _, s := range project.Services {
		for _, p := range s.Ports {
			ports[strconv.Itoa(int(p.Target))] = freePort(t)
		}
	}
	volumes := map[string]string{}
	for name := range project.Volumes {
		volumes[name] = filepath.Join(dir, "volumes", name)
	}
	containers := map[string]*container{}
	for _, name := range project.ServiceNames() {
		s := project.Services[name]
		c := &container{root: filepath.Join(dir, "containers", name), ports: ports, hosts: project.ServiceNames()}
		for _, v := range s.Volumes {
			host := volumes[v.Source]
			if v.Type == types.VolumeTypeBind {
				// The project directory the user made.
				host = filepath.Join(dir, "host", filepath.Base(v.Source))
			}
			if err := c.mount(path.Clean(v.Target), host); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(c.path(img.workdir), 0o755); err != nil {
			t.Fatal(err)
		}
		containers[name] = c
	}

	for _, name := range startOrder(t, project) {
		s := project.Services[name]
		argv := []string(s.Command)
		cmd := containers[name].command(img, s, argv)
		if s.Restart == types.RestartPolicyNo {
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: shoal %s: %v\n%s", name, strings.Join(cmd.Args[1:], " "), err, out)
			}
			continue
		}
		startRunning(t, name, cmd).waitLine(t, name, ready[argv[0]])
	}

	// On the host: a client's credentials, as the header of compose.yaml
	// issues them, and shoal against the published port.
	coord := containers["coordinator"]
	issue := coord.command(img, project.Services["coordinator"], []string{"creds", "client", "me"})
	creds, err := issue.Output()
	if err != nil {
		t.Fatalf("shoal creds client me in the coordinator: %v", err)
	}
	credsFile := filepath.Join(dir, "me.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	natsURL := "nats://127.0.0.1:" + ports["4222"]
	host := func(args ...string) (string, string, error) {
		cmd := exec.Command(shoalBin, args...)
		cmd.Dir = filepath.Join(dir, "host")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + cmd.Dir}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	var nodes string
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, errOut, err := host("nodes", "--nats", natsURL, "--creds", credsFile)
		if err != nil {
			t.Fatalf("shoal nodes with the client's credentials: %v: %s", err, errOut)
		}
		nodes = out
		if strings.Contains(nodes, "\nnode-a ") && strings.Contains(nodes, "\nnode-b ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes did not both join:\n%s", nodes)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, errOut, err := host("nodes", "--nats", natsURL); err == nil || !strings.Contains(errOut, "requires credentials") {
		t.Errorf("an anonymous client: %v %q, want a refusal for want of credentials", err, errOut)
	}

	mcp := "http://127.0.0.1:" + ports["7270"] + "/mcp"
	for _, c := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"wrong", http.StatusUnauthorized}, {composeToken, http.StatusOK}} {
		if got := mcpInitialize(t, mcp, c.token); got != c.want {
			t.Errorf("MCP initialize with token %q: status %d, want %d", c.token, got, c.want)
		}
	}

	for _, c := range []struct{ volume, dir string }{
		{"coordinator-data", "jetstream"}, {"coordinator-data", "auth"},
		{"node-a-cache", "shoal/agents/node-a"}, {"node-b-cache", "shoal/agents/node-b"},
	} {
		if fi, err := os.Stat(filepath.Join(volumes[c.volume], c.dir)); err != nil || !fi.IsDir() {
			t.Errorf("volume %s holds no %s: %v", c.volume, c.dir, err)
		}
	}
}

// mcpInitialize sends an MCP initialize request and returns the status.
func mcpInitialize(t *testing.T, endpoint, token string) int {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"compose-test","version":"0"}}}`
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("MCP at %s: %v", endpoint, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
