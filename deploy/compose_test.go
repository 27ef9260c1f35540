// Package deploy holds the deployment files; its tests load compose.yaml
// with compose-go, the library `docker compose config` uses, parse the
// systemd units and read the launchd plist with encoding/xml.
package deploy_test

import (
	"context"
	"os"
	"slices"
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
