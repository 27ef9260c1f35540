package workspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// bundleRef is the one ref of every bundle Shoal writes: the commit it
// carries.
const bundleRef = "refs/shoal/tip"

// writeBundle writes to path a git bundle of tip and what it needs beyond
// haves, reading objects (named by the hash format) from the directories
// in objects, through g. A temporary repository made in the empty directory tmp, that
// reads those objects, names tip, so the repositories they belong to are
// not touched. Haves that are not there are left out. It returns how many
// commits the bundle holds; a bundle of none is not written (0, nil).
func writeBundle(ctx context.Context, g gitter, tmp string, objects []string, format, tip string, haves []string, path string) (int, error) {
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", "--bare", "--object-format="+format, tmp); err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "objects", "info", "alternates"), []byte(alternates(objects, "\n")+"\n"), 0o600); err != nil {
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

// bundleHeader is what a git bundle's header says: the hash format
// (sha1 or sha256) of its objects, and the commits it builds on, which
// a repository must hold to fetch from it.
type bundleHeader struct {
	format        string
	prerequisites []string
}

// readBundleHeader reads the header of the git bundle at path, up to the
// blank line that ends it: its first line ("# v2 git bundle" or "# v3 git
// bundle"), a v3 bundle's capabilities ("@name=value"), its prerequisites
// ("-<id> …") and its refs. A file that is not a bundle is an error.
func readBundleHeader(path string) (bundleHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return bundleHeader{}, err
	}
	defer f.Close()
	r := bufio.NewReader(io.LimitReader(f, maxBundleHeader))
	first, err := r.ReadString('\n')
	h := bundleHeader{format: "sha1"}
	switch {
	case err != nil && first == "":
		return h, errors.New("an empty file, not a git bundle")
	case first != "# v2 git bundle\n" && first != "# v3 git bundle\n":
		return h, fmt.Errorf("not a git bundle (it begins %q)", first[:min(len(first), 40)])
	}
	v3 := first == "# v3 git bundle\n"
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return h, fmt.Errorf("a git bundle whose header does not end within %d bytes", maxBundleHeader)
		}
		switch {
		case l == "\n":
			return h, nil
		case v3 && strings.HasPrefix(l, "@"):
			if v, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "@object-format="); ok {
				if v != "sha1" && v != "sha256" {
					return h, fmt.Errorf("a git bundle of objects named by %q, which Shoal does not know", v)
				}
				h.format = v
			}
		case strings.HasPrefix(l, "-"):
			id, _, _ := strings.Cut(strings.TrimSuffix(l[1:], "\n"), " ")
			h.prerequisites = append(h.prerequisites, id)
		}
	}
}

// maxBundleHeader bounds what is read of a bundle's header.
const maxBundleHeader = 1 << 20

// fetchArgs are the arguments of a git fetch of ref from bundle into the
// repository it runs in: no tags, no FETCH_HEAD, and nothing of the
// repository's submodules (git would fetch in each one whose commit the
// bundle moves, from its remote: a remote reached, refs moved and a wait
// without bound, for what the agent committed), nor its automatic
// maintenance.
func fetchArgs(bundle, refspec string) []string {
	return []string{"fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules", "--no-auto-maintenance", bundle, refspec}
}
