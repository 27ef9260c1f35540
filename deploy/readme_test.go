package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README names only deployment files that exist, and the shoal
// commands of its deployment section are ones the binary accepts.
func TestReadmeDeploySection(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, p := range regexp.MustCompile(`deploy/[A-Za-z0-9_./-]*`).FindAllString(readme, -1) {
		p = strings.TrimRight(p, ".")
		if _, err := os.Stat(filepath.Join("..", p)); err != nil {
			t.Errorf("the README names %s: %v", p, err)
		}
	}
	_, section, ok := strings.Cut(readme, "\n### Deploying")
	if !ok {
		t.Fatal("the README has no section ### Deploying")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	section, _, _ = strings.Cut(section, "\n### ")
	cmds := documentedCommands(t, section)
	if len(cmds) < 3 {
		t.Fatalf("the deployment section shows %d shoal commands: %q", len(cmds), cmds)
	}
	for _, c := range cmds {
		if err := accepts(c); err != nil {
			t.Errorf("the README's deployment section: %v", err)
		}
	}
}
