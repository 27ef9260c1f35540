package deploy_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strings"
	"testing"
)

// image is what the final stage of a Dockerfile gives a container: its
// user, working directory, environment and entrypoint, and the
// directories its RUN steps made, with the owner each was left with.
type image struct {
	user       string
	workdir    string
	env        map[string]string
	entrypoint []string
	dirs       map[string]string // path → owner
}

// parseDockerfile reads the final stage of a Dockerfile: instructions on
// lines continued with a backslash, # comment lines skipped. Of RUN's
// shell commands (split at &&) it follows mkdir and chown, which is all
// this file uses to make directories.
func parseDockerfile(text string) (*image, error) {
	var img *image
	var cur strings.Builder
	var instructions []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		instructions = append(instructions, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("the last instruction ends in a backslash: %q", cur.String())
	}
	for _, ins := range instructions {
		keyword, args, _ := strings.Cut(ins, " ")
		args = strings.TrimSpace(args)
		switch strings.ToUpper(keyword) {
		case "FROM":
			img = &image{user: "root", workdir: "/", env: map[string]string{}, dirs: map[string]string{"/": "root"}}
		case "USER":
			if img == nil {
				return nil, fmt.Errorf("USER before FROM")
			}
			img.user = args
		case "WORKDIR":
			if img == nil {
				return nil, fmt.Errorf("WORKDIR before FROM")
			}
			img.workdir = args
		case "ENV":
			if img == nil {
				return nil, fmt.Errorf("ENV before FROM")
			}
			for _, kv := range strings.Fields(args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("ENV %s: write KEY=value", args)
				}
				img.env[k] = v
			}
		case "ENTRYPOINT":
			if img == nil {
				return nil, fmt.Errorf("ENTRYPOINT before FROM")
			}
			img.entrypoint = nil
			for _, a := range strings.Split(strings.Trim(args, "[]"), ",") {
				img.entrypoint = append(img.entrypoint, strings.Trim(strings.TrimSpace(a), `"`))
			}
		case "RUN":
			if img == nil {
				return nil, fmt.Errorf("RUN before FROM")
			}
			for _, c := range strings.Split(args, "&&") {
				if err := img.run(strings.Fields(c)); err != nil {
					return nil, err
				}
			}
		}
	}
	if img == nil {
		return nil, fmt.Errorf("no FROM")
	}
	return img, nil
}

// run follows one shell command's effect on directories.
func (img *image) run(argv []string) error {
	if len(argv) == 0 {
		return nil
	}
	var flags, operands []string
	for _, a := range argv[1:] {
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
		} else {
			operands = append(operands, a)
		}
	}
	switch argv[0] {
	case "mkdir":
		for _, p := range operands {
			if !path.IsAbs(p) {
				return fmt.Errorf("mkdir %s: a relative path", p)
			}
			for d := path.Clean(p); img.dirs[d] == ""; d = path.Dir(d) {
				img.dirs[d] = img.user
			}
		}
	case "chown":
		if len(operands) < 2 {
			return fmt.Errorf("chown %v: want an owner and paths", argv[1:])
		}
		owner, _, _ := strings.Cut(operands[0], ":")
		recursive := len(flags) > 0 && (flags[0] == "-R" || flags[0] == "--recursive")
		for _, p := range operands[1:] {
			p = path.Clean(p)
			img.dirs[p] = owner
			if !recursive {
				continue
			}
			for d := range img.dirs {
				if strings.HasPrefix(d, p+"/") {
					img.dirs[d] = owner
				}
			}
		}
	}
	return nil
}

// The Dockerfile parser follows the directories mkdir makes and chown
// gives away, in order.
func TestParseDockerfile(t *testing.T) {
	t.Parallel()
	img, err := parseDockerfile(`FROM a AS build
USER builder
FROM b
# a comment
RUN mkdir -p /x/y /z \
 && chown -R app:app /x \
 && mkdir /x/late /w && chown app /w
USER app
WORKDIR /x
ENV A=1 B=/b
ENTRYPOINT ["/bin/tool", "sub"]
`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"/": "root", "/x": "app", "/x/y": "app", "/z": "root", "/x/late": "root", "/w": "app"}
	for p, owner := range want {
		if img.dirs[p] != owner {
			t.Errorf("%s: owner %q, want %q", p, img.dirs[p], owner)
		}
	}
	if img.user != "app" || img.workdir != "/x" || img.env["B"] != "/b" || strings.Join(img.entrypoint, " ") != "/bin/tool sub" {
		t.Errorf("user %q workdir %q env %v entrypoint %q", img.user, img.workdir, img.env, img.entrypoint)
	}
	if _, err := parseDockerfile("FROM a\nRUN x \\\n"); err == nil {
		t.Error("a dangling continuation is accepted")
	}
}

// The image refuses to be built for root: its uid guard, run as the
// Dockerfile runs it, fails for SHOAL_UID=0 in one line and passes for
// another uid.
func TestDockerfileRefusesRootUID(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var guard string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, `"$SHOAL_UID" != 0`) {
			guard = strings.TrimPrefix(l, "RUN ")
		}
	}
	if guard == "" {
		t.Fatal("the Dockerfile has no RUN that refuses SHOAL_UID=0")
	}
	for uid, ok := range map[string]bool{"0": false, "1000": true, "10001": true} {
		cmd := exec.Command("/bin/sh", "-c", guard)
		cmd.Env = []string{"SHOAL_UID=" + uid}
		out, err := cmd.CombinedOutput()
		if (err == nil) != ok || (!ok && (strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), "may not be root"))) {
			t.Errorf("SHOAL_UID=%s: %v, %q", uid, err, out)
		}
	}
}
