// Package deploy holds the deployment files; its tests load compose.yaml
// with compose-go, the library `docker compose config` uses, and check it
// against deploy/Dockerfile and the shoal binary, run systemd-analyze on
// the systemd units, read the launchd plists with encoding/xml and load
// the NATS configuration examples with nats-server's own parser.
package deploy_test

import (
	"context"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// composeToken is the MCP token the tests give compose.yaml.
const composeToken = "compose-test-token-5e0c"

// loadCompose loads compose.yaml as `docker compose` would, with env as
// the whole environment.
func loadCompose(env ...string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{"../compose.yaml"}, cli.WithWorkingDirectory(".."), cli.WithEnv(env))
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

func mustLoadCompose(t *testing.T) *types.Project {
	t.Helper()
	project, err := loadCompose("SHOAL_MCP_TOKEN=" + composeToken)
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return project
}

func mustParseDockerfile(t *testing.T) *image {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	img, err := parseDockerfile(string(b))
	if err != nil {
		t.Fatalf("deploy/Dockerfile: %v", err)
	}
	return img
}

// flagValue is the value of --<name> in argv, or "".
func flagValue(argv []string, name string) string {
	for i, a := range argv {
		if a == "--"+name && i+1 < len(argv) {
			return argv[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// listens are the host:port addresses a shoal command line listens on.
func listens(argv []string) []string {
	if len(argv) == 0 || argv[0] != "up" {
		return nil
	}
	host, port := flagValue(argv, "host"), flagValue(argv, "port")
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "4222"
	}
	out := []string{net.JoinHostPort(host, port)}
	if !slices.Contains(argv, "--no-mcp") {
		mcp := flagValue(argv, "mcp-listen")
		if mcp == "" {
			mcp = "127.0.0.1:7270"
		}
		out = append(out, mcp)
	}
	return out
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// mountAt is the service's volume mounted at target, or nil.
func mountAt(s types.ServiceConfig, target string) *types.ServiceVolumeConfig {
	for i := range s.Volumes {
		if path.Clean(s.Volumes[i].Target) == path.Clean(target) {
			return &s.Volumes[i]
		}
	}
	return nil
}

// mountOf is the service's mount a container path lies in, or nil.
func mountOf(s types.ServiceConfig, p string) *types.ServiceVolumeConfig {
	var best *types.ServiceVolumeConfig
	for i, v := range s.Volumes {
		if p == v.Target || strings.HasPrefix(p, strings.TrimSuffix(v.Target, "/")+"/") {
			if best == nil || len(v.Target) > len(best.Target) {
				best = &s.Volumes[i]
			}
		}
	}
	return best
}

// completedBefore reports whether service a starts only once b has
// exited successfully: a, or a service a waits for, depends on b with
// condition service_completed_successfully.
func completedBefore(p *types.Project, a, b string) bool {
	seen := map[string]bool{}
	var walk func(name string) bool
	walk = func(name string) bool {
		if seen[name] {
			return false
		}
		seen[name] = true
		for dep, d := range p.Services[name].DependsOn {
			if dep == b && d.Condition == types.ServiceConditionCompletedSuccessfully {
				return true
			}
			if walk(dep) {
				return true
			}
		}
		return false
	}
	return walk(a)
}

// compose.yaml is a coordinator and two nodes built from deploy/Dockerfile
// that work as containers: every port published on the host's loopback
// only and listened on where Docker forwards it; every volume mounted on
// a directory the image made and gave to the user the service runs as;
// state and caches where shoal keeps them; authentication on, with each
// node's credentials issued before it starts and mounted read-only; and
// command lines and SHOAL_* variables the shoal binary accepts.
func TestComposeConfig(t *testing.T) {
	t.Parallel()
	project := mustLoadCompose(t)
	img := mustParseDockerfile(t)

	names := project.ServiceNames()
	slices.Sort(names)
	if !slices.Equal(names, []string{"coordinator", "creds-node-a", "creds-node-b", "node-a", "node-b"}) {
		t.Fatalf("services %v", names)
	}
	coord := project.Services["coordinator"]
	if coord.Build == nil || coord.Build.Dockerfile != "deploy/Dockerfile" {
		t.Errorf("the coordinator is not built from deploy/Dockerfile: %+v", coord.Build)
	}
	if strings.Join(img.entrypoint, " ") != "/usr/local/bin/shoal" {
		t.Errorf("the image's entrypoint is %q, not the shoal binary", img.entrypoint)
	}

	text, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range documentedCommands(t, comments(string(text))) {
		if err := accepts(c); err != nil {
			t.Errorf("compose.yaml, a command in the comments: %v", err)
		}
	}

	published := map[uint32]bool{}
	for _, name := range names {
		s := project.Services[name]
		argv := []string(s.Command)
		if s.Image != coord.Image {
			t.Errorf("%s: image %q, want the coordinator's %q", name, s.Image, coord.Image)
		}
		if len(s.Entrypoint) > 0 {
			t.Errorf("%s: entrypoint %q replaces the image's shoal", name, s.Entrypoint)
		}
		if s.User != "" && s.User != img.user {
			t.Errorf("%s: runs as %q, the Dockerfile's USER is %q", name, s.User, img.user)
		}
		if len(argv) == 0 {
			t.Errorf("%s: no command", name)
			continue
		}
		if err := accepts(argv); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for k := range s.Environment {
			if strings.HasPrefix(k, "SHOAL_") && !envNames(t, argv[0])[k] {
				t.Errorf("%s: shoal %s reads no variable %s", name, argv[0], k)
			}
		}
		if oneShot := argv[0] == "creds"; oneShot != (s.Restart == types.RestartPolicyNo) {
			t.Errorf("%s: restart %q for shoal %s", name, s.Restart, argv[0])
		}

		// Ports: on the host's loopback, onto a listener that is not on
		// the container's loopback (where a forwarded port reaches nothing).
		listening := listens(argv)
		for _, p := range s.Ports {
			published[p.Target] = true
			if p.HostIP != "127.0.0.1" {
				t.Errorf("%s: port %d is published on %q, not on the host's loopback 127.0.0.1", name, p.Target, p.HostIP)
			}
			if p.Published != strconv.Itoa(int(p.Target)) {
				t.Errorf("%s: container port %d is published as %q, not as itself", name, p.Target, p.Published)
			}
			found := false
			for _, l := range listening {
				host, port, _ := net.SplitHostPort(l)
				if port != strconv.Itoa(int(p.Target)) {
					continue
				}
				found = true
				if isLoopback(host) {
					t.Errorf("%s: port %d is published but shoal listens on %s, the container's loopback", name, p.Target, l)
				}
			}
			if !found {
				t.Errorf("%s: port %d is published but shoal listens on %v", name, p.Target, listening)
			}
		}

		// Volumes: each on a directory the image made and gave the user.
		for _, v := range s.Volumes {
			switch v.Type {
			case types.VolumeTypeVolume:
				if _, ok := project.Volumes[v.Source]; !ok {
					t.Errorf("%s: volume %q is not declared", name, v.Source)
				}
			case types.VolumeTypeBind:
				if v.Bind == nil || bool(v.Bind.CreateHostPath) {
					t.Errorf("%s: the bind mount of %s would make a missing %s owned by root; set create_host_path: false", name, v.Target, v.Source)
				}
			default:
				t.Errorf("%s: a %s mount at %s", name, v.Type, v.Target)
			}
			if owner, ok := img.dirs[path.Clean(v.Target)]; !ok {
				t.Errorf("%s: %s is mounted on %s, which the Dockerfile does not make: Docker would make it owned by root", name, v.Source, v.Target)
			} else if owner != img.user {
				t.Errorf("%s: %s is mounted on %s, which the Dockerfile leaves to %s, not %s", name, v.Source, v.Target, owner, img.user)
			}
		}
	}
	for _, port := range []uint32{4222, 7270} {
		if !published[port] {
			t.Errorf("port %d (NATS 4222, MCP 7270) is not published", port)
		}
	}

	// The coordinator: authentication on, its MCP token given, its state
	// in a volume where shoal keeps it.
	up := []string(coord.Command)
	if up[0] != "up" || !slices.Contains(up, "--auth") {
		t.Errorf("coordinator: %q does not run shoal up --auth", up)
	}
	if tok := coord.Environment["SHOAL_MCP_TOKEN"]; tok == nil || *tok != composeToken {
		t.Errorf("coordinator: SHOAL_MCP_TOKEN is %v, want the token from the environment", tok)
	}
	stateDir := img.env["XDG_DATA_HOME"] + "/shoal"
	state := mountAt(coord, stateDir)
	if img.env["XDG_DATA_HOME"] == "" || state == nil || state.Type != types.VolumeTypeVolume {
		t.Fatalf("coordinator: no volume on %s, where shoal up keeps its store and keys", stateDir)
	}

	// Credentials: every service that opens the keys (up and creds) mounts
	// the coordinator's state, and no two make them at once.
	var keyHolders []string
	outs := map[string]string{} // volume → the service that writes credentials into it
	for _, name := range names {
		s := project.Services[name]
		argv := []string(s.Command)
		if argv[0] != "up" && argv[0] != "creds" {
			continue
		}
		keyHolders = append(keyHolders, name)
		if m := mountAt(s, stateDir); m == nil || m.Source != state.Source {
			t.Errorf("%s: runs shoal %s without the coordinator's volume %s on %s", name, argv[0], state.Source, stateDir)
		}
		if argv[0] == "creds" {
			out := flagValue(argv, "out")
			m := mountOf(s, out)
			switch {
			case len(argv) < 3 || argv[1] != "node":
				t.Errorf("%s: %q issues no node's credentials", name, argv)
			case m == nil || m.Type != types.VolumeTypeVolume || m.Source == state.Source:
				t.Errorf("%s: writes %q outside a volume of its own", name, out)
			default:
				outs[m.Source] = name
			}
		}
	}
	for i, a := range keyHolders {
		for _, b := range keyHolders[i+1:] {
			if !completedBefore(project, a, b) && !completedBefore(project, b, a) {
				t.Errorf("%s and %s may start together, and both would make the coordinator's keys", a, b)
			}
		}
	}

	// Nodes: joined with credentials, issued before they start, mounted
	// read-only; their cache in a volume; the projects mounted alike.
	var projects []string
	for _, name := range []string{"node-a", "node-b"} {
		s := project.Services[name]
		argv := []string(s.Command)
		if argv[0] != "node" {
			t.Errorf("%s: %q is not shoal node", name, argv)
			continue
		}
		if nats := flagValue(argv, "nats"); !strings.HasPrefix(nats, "nats://coordinator:") {
			t.Errorf("%s: --nats %q, want the coordinator's service name", name, nats)
		}
		if mountAt(s, stateDir) != nil {
			t.Errorf("%s: mounts the coordinator's keys", name)
		}
		creds := flagValue(argv, "creds")
		m := mountOf(s, creds)
		if m == nil {
			t.Errorf("%s: --creds %q lies in no volume", name, creds)
		} else {
			issuer := outs[m.Source]
			if issuer == "" || !m.ReadOnly {
				t.Errorf("%s: --creds %q: volume %s (read-only %v) holds no credentials a creds step wrote", name, creds, m.Source, m.ReadOnly)
			} else if !completedBefore(project, name, issuer) {
				t.Errorf("%s: starts before %s has issued its credentials", name, issuer)
			} else if want := project.Services[issuer].Command[2]; want != name {
				t.Errorf("%s: joins with the credentials of node %s", name, want)
			}
			for _, other := range names {
				for _, v := range project.Services[other].Volumes {
					if other != name && other != issuer && v.Source == m.Source {
						t.Errorf("%s also mounts %s, the credentials of %s", other, m.Source, name)
					}
				}
			}
		}
		if c := mountAt(s, img.env["XDG_CACHE_HOME"]); c == nil || c.Type != types.VolumeTypeVolume {
			t.Errorf("%s: no volume on %s, where the node keeps its agents' files", name, img.env["XDG_CACHE_HOME"])
		}
		p := mountAt(s, "/projects")
		if p == nil || p.Type != types.VolumeTypeBind || p.ReadOnly {
			t.Errorf("%s: no writable project directory on /projects: %+v", name, p)
			continue
		}
		projects = append(projects, p.Source)
	}
	if len(projects) == 2 && projects[0] != projects[1] {
		t.Errorf("the nodes mount different project directories %v; an agent placed on either must find its directory", projects)
	}
}

// Without an MCP token compose.yaml does not load: the endpoint listens
// off the container's loopback, and there it must have one.
func TestComposeNeedsMCPToken(t *testing.T) {
	t.Parallel()
	_, err := loadCompose()
	if err == nil || !strings.Contains(err.Error(), "SHOAL_MCP_TOKEN") {
		t.Fatalf("compose.yaml loaded without SHOAL_MCP_TOKEN: %v", err)
	}
}

// Nothing the compose set-up writes or holds goes into the image's build
// context: the token in .env, credentials, the projects.
func TestDockerignore(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for _, want := range []string{".env", "**/*.creds", "projects"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
}
