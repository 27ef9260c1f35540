// Package deploy holds the deployment files; its test loads compose.yaml
// with compose-go, the library `docker compose config` uses.
package deploy_test

import (
	"context"
	"encoding/xml"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
)

// compose.yaml is valid Compose: a coordinator and two nodes built from
// one Dockerfile, the nodes on the coordinator's network.
func TestComposeConfig(t *testing.T) {
	opts, err := cli.NewProjectOptions([]string{"../compose.yaml"}, cli.WithWorkingDirectory(".."), cli.WithOsEnv)
	if err != nil {
		t.Fatal(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	names := project.ServiceNames()
	slices.Sort(names)
	if !slices.Equal(names, []string{"coordinator", "node-a", "node-b"}) {
		t.Fatalf("services %v", names)
	}
	coord := project.Services["coordinator"]
	if coord.Build == nil || coord.Build.Dockerfile != "deploy/Dockerfile" {
		t.Errorf("the coordinator is not built from deploy/Dockerfile: %+v", coord.Build)
	}
	if _, err := os.Stat("Dockerfile"); err != nil {
		t.Errorf("deploy/Dockerfile: %v", err)
	}
	for _, n := range []string{"node-a", "node-b"} {
		s := project.Services[n]
		if s.Image != coord.Image || s.NetworkMode != "service:coordinator" || s.Command[0] != "node" {
			t.Errorf("%s: image %q network %q command %v", n, s.Image, s.NetworkMode, s.Command)
		}
	}
}

// The launchd plist is well-formed XML and runs `shoal node`.
func TestLaunchdPlist(t *testing.T) {
	b, err := os.ReadFile("launchd/dev.shoal.node.plist")
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(string(b)))
	for {
		_, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("plist: %v", err)
		}
	}
	if !strings.Contains(string(b), "<string>node</string>") || !strings.Contains(string(b), "VMLX_HOST") {
		t.Error("the plist does not run a node with VMLX_HOST")
	}
}
