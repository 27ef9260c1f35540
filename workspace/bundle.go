package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// bundleRef is the one ref of every bundle Shoal writes: the commit it
// carries.
const bundleRef = "refs/shoal/tip"

// writeBundle writes to path a git bundle of tip and what it needs beyond
// haves, reading objects from the directories in objects (one a line),
// through g. A temporary repository made in the empty directory tmp, that
// reads those objects, names tip, so the repositories they belong to are
// not touched. Haves that are not there are left out. It returns how many
// commits the bundle holds; a bundle of none is not written (0, nil).
func writeBundle(ctx context.Context, g gitter, tmp, objects, tip string, haves []string, path string) (int, error) {
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", "--bare", tmp); err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "objects", "info", "alternates"), []byte(objects+"\n"), 0o600); err != nil {
		return 0, err
	}
	if _, err := g.run(ctx, tmp, nil, nil, "update-ref", bundleRef, tip); err != nil {
		return 0, fmt.Errorf("commit %s is not in the repository: %v", tip, err)
	}
	args := []string{bundleRef}
	if len(haves) > 0 {
		known, err := present(ctx, g, tmp, haves)
		if err != nil {
			return 0, err
		}
		for _, h := range known {
			args = append(args, "^"+h)
		}
	}
	n, err := g.line(ctx, tmp, nil, append([]string{"rev-list", "--count"}, args...)...)
	if err != nil {
		return 0, err
	}
	count, err := strconv.Atoi(n)
	if err != nil || count == 0 {
		return 0, err
	}
	if _, err := g.run(ctx, tmp, nil, nil, append([]string{"bundle", "create", "--quiet", path}, args...)...); err != nil {
		return 0, err
	}
	return count, nil
}

// present returns those of the commits that repository dir has.
func present(ctx context.Context, g gitter, dir string, commits []string) ([]string, error) {
	var in strings.Builder
	for _, c := range commits {
		if IsCommitID(c) {
			in.WriteString(c + "\n")
		}
	}
	out, err := g.run(ctx, dir, nil, []byte(in.String()), "cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return nil, err
	}
	var known []string
	for l := range strings.Lines(out) {
		f := strings.Fields(l)
		if len(f) == 2 && f[1] == "commit" {
			known = append(known, f[0])
		}
	}
	return known, nil
}
