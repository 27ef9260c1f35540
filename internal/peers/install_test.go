package peers_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoalfabric/shoal/internal/peers"
)

// The installer is idempotent: with every peer in the cache (the test
// command installed them), installing again installs nothing. A folder
// whose marker names another version, or that lacks the CLI, does not
// count as installed.
func TestInstallIsIdempotent(t *testing.T) {
	root := peers.Dir()
	for _, p := range peers.All {
		if !p.Installed(root) {
			t.Fatalf("%s is not installed in %s; the test command installs it (scripts/test), or run: go run ./internal/peers/install", p.Spec(), root)
		}
		installed, err := p.Install(t.Context(), root)
		if err != nil || installed {
			t.Errorf("installing %s again: installed=%v err=%v; want nothing done", p.Spec(), installed, err)
		}
		if !p.Installed(root) {
			t.Errorf("%s is no longer installed after a second run", p.Spec())
		}

		other := t.TempDir()
		dir := p.InstallDir(other)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ".shoal-installed"), []byte(p.Package+"@0.0.0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if p.Installed(other) {
			t.Errorf("%s counts as installed with a marker for another version", p.Spec())
		}
		if err := os.WriteFile(filepath.Join(dir, ".shoal-installed"), []byte(p.Spec()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if p.Installed(other) {
			t.Errorf("%s counts as installed in a folder without its CLI", p.Spec())
		}
	}
}
