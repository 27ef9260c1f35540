package deploy_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// plistNode is one element of a property list.
type plistNode struct {
	name string
	text string
	kids []*plistNode
}

// parsePlist reads a property list with encoding/xml into its elements,
// checking it is one <plist version="1.0"> holding one value, and that
// every value is of a plist type and every <dict> is keys and values in
// turn, each key once.
func parsePlist(r io.Reader) (*plistNode, error) {
	d := xml.NewDecoder(r)
	var stack []*plistNode
	var root *plistNode
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &plistNode{name: tok.Name.Local}
			if len(stack) == 0 {
				if root != nil {
					return nil, fmt.Errorf("a second root element <%s>", n.name)
				}
				if n.name != "plist" || !slices.Contains(tok.Attr, xml.Attr{Name: xml.Name{Local: "version"}, Value: "1.0"}) {
					return nil, fmt.Errorf("the root is <%s %v>, not <plist version=\"1.0\">", n.name, tok.Attr)
				}
				root = n
			} else {
				top := stack[len(stack)-1]
				top.kids = append(top.kids, n)
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].text += string(tok)
			}
		}
	}
	if root == nil || len(root.kids) != 1 {
		return nil, errors.New("the plist does not hold exactly one value")
	}
	return root.kids[0], checkValue(root.kids[0])
}

func checkValue(n *plistNode) error {
	switch n.name {
	case "string", "integer", "real", "date", "data":
		if len(n.kids) > 0 {
			return fmt.Errorf("<%s> holds elements", n.name)
		}
	case "true", "false":
		if len(n.kids) > 0 || strings.TrimSpace(n.text) != "" {
			return fmt.Errorf("<%s/> is not empty", n.name)
		}
	case "array":
		for _, k := range n.kids {
			if err := checkValue(k); err != nil {
				return err
			}
		}
	case "dict":
		if len(n.kids)%2 != 0 {
			return errors.New("a <dict> with a key and no value")
		}
		seen := map[string]bool{}
		for i := 0; i < len(n.kids); i += 2 {
			key, val := n.kids[i], n.kids[i+1]
			if key.name != "key" {
				return fmt.Errorf("<%s> where a <dict> needs a <key>", key.name)
			}
			if seen[key.text] {
				return fmt.Errorf("the key %s twice in one <dict>", key.text)
			}
			seen[key.text] = true
			if err := checkValue(val); err != nil {
				return fmt.Errorf("%s: %w", key.text, err)
			}
		}
	default:
		return fmt.Errorf("<%s> is not a plist value", n.name)
	}
	return nil
}

// entry returns the value of key in a <dict>, or nil.
func (n *plistNode) entry(key string) *plistNode {
	for i := 0; i+1 < len(n.kids); i += 2 {
		if n.kids[i].name == "key" && n.kids[i].text == key {
			return n.kids[i+1]
		}
	}
	return nil
}

// xmlComments are the text of the comments in an XML document.
func xmlComments(text string) (string, error) {
	d := xml.NewDecoder(strings.NewReader(text))
	var b strings.Builder
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return b.String(), nil
		}
		if err != nil {
			return "", err
		}
		if c, ok := tok.(xml.Comment); ok {
			b.Write(c)
			b.WriteByte('\n')
		}
	}
}

// launchAgent is a parsed launchd plist of this directory.
type launchAgent struct {
	file     string
	top      *plistNode
	argv     []string
	env      map[string]string
	comments string
}

// readLaunchAgent reads launchd/file and checks what every agent here
// needs: a <dict> labelled as its file is named, ProgramArguments from an
// absolute path (and no Program to override it), started at load and
// kept alive, with string environment variables, documented with
// `launchctl bootstrap gui/$UID` of the file where it is installed (never
// the deprecated load and unload). (encoding/xml refuses a comment with
// "--" in it, as XML does.)
func readLaunchAgent(t *testing.T, file string) *launchAgent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("launchd", file))
	if err != nil {
		t.Fatal(err)
	}
	top, err := parsePlist(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if top.name != "dict" {
		t.Fatalf("%s holds a <%s>, not a <dict>", file, top.name)
	}
	a := &launchAgent{file: file, top: top, env: map[string]string{}}
	label := strings.TrimSuffix(file, ".plist")
	if l := top.entry("Label"); l == nil || l.name != "string" || l.text != label {
		t.Errorf("%s: Label %+v, want the string %s (the file's name)", file, l, label)
	}
	args := top.entry("ProgramArguments")
	if args == nil || args.name != "array" {
		t.Fatalf("%s: ProgramArguments %+v, want an <array>", file, args)
	}
	for _, arg := range args.kids {
		if arg.name != "string" {
			t.Errorf("%s: ProgramArguments holds a <%s>, not a <string>", file, arg.name)
		}
		a.argv = append(a.argv, arg.text)
	}
	if len(a.argv) == 0 || !path.IsAbs(a.argv[0]) {
		t.Fatalf("%s: ProgramArguments %q do not start with an absolute path", file, a.argv)
	}
	if top.entry("Program") != nil {
		t.Errorf("%s: Program is set too; launchd would run it instead of ProgramArguments[0]", file)
	}
	// KeepAlive: always (<true/>), or a dict that at least restarts on a
	// failure (SuccessfulExit false).
	switch k := top.entry("KeepAlive"); {
	case k == nil:
		t.Errorf("%s: no KeepAlive: launchd would not restart it when it stops", file)
	case k.name == "true":
	case k.name == "dict":
		if s := k.entry("SuccessfulExit"); s == nil || s.name != "false" {
			t.Errorf("%s: KeepAlive is a dict without SuccessfulExit <false/>: %+v", file, k.kids)
		}
	default:
		t.Errorf("%s: KeepAlive is <%s/>, so it is not kept alive", file, k.name)
	}
	if r := top.entry("RunAtLoad"); r == nil || r.name != "true" {
		t.Errorf("%s: RunAtLoad %+v, want <true/>", file, r)
	}
	if env := top.entry("EnvironmentVariables"); env != nil {
		if env.name != "dict" {
			t.Fatalf("%s: EnvironmentVariables %+v, want a <dict>", file, env)
		}
		for i := 0; i+1 < len(env.kids); i += 2 {
			if v := env.kids[i+1]; v.name != "string" {
				t.Errorf("%s: the variable %s is a <%s>, not a <string>", file, env.kids[i].text, v.name)
			} else {
				a.env[env.kids[i].text] = v.text
			}
		}
	}

	if a.comments, err = xmlComments(string(b)); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	launchctl := regexp.MustCompile(`launchctl\s+(\S+)\s+(\S+)(?:\s+(\S+))?`)
	bootstrap := false
	for _, m := range launchctl.FindAllStringSubmatch(a.comments, -1) {
		for i := range m {
			m[i] = strings.TrimRight(m[i], ",.;")
		}
		switch m[1] {
		case "load", "unload":
			t.Errorf("%s: documents the deprecated launchctl %s; use bootstrap and bootout", file, m[1])
		case "bootstrap":
			bootstrap = true
			if m[2] != "gui/$UID" || m[3] != "~/Library/LaunchAgents/"+file {
				t.Errorf("%s: %q, want launchctl bootstrap gui/$UID ~/Library/LaunchAgents/%s", file, m[0], file)
			}
		case "bootout":
			if m[2] != "gui/$UID/"+label {
				t.Errorf("%s: %q, want launchctl bootout gui/$UID/%s", file, m[0], label)
			}
		}
	}
	if !bootstrap {
		t.Errorf("%s: its comments do not say how to start it (launchctl bootstrap)", file)
	}
	if !strings.Contains(a.comments, "cp deploy/launchd/"+file+" ~/Library/LaunchAgents/") {
		t.Errorf("%s: its comments do not say to copy it to ~/Library/LaunchAgents/", file)
	}
	for _, c := range documentedCommands(t, a.comments) {
		if err := accepts(c); err != nil {
			t.Errorf("%s: a command in the comments: %v", file, err)
		}
	}
	return a
}

// The launchd agents of an Apple machine: a node that runs `shoal node`
// with flags the binary accepts, joining over loopback, and mlx_lm.server
// on the machine's loopback at the host and port the node's VMLX_HOST
// names, with a model to serve.
func TestLaunchdPlists(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("launchd/*.plist")
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		files[i] = filepath.Base(files[i])
	}
	slices.Sort(files)
	if !slices.Equal(files, []string{"dev.shoal.mlx.plist", "dev.shoal.node.plist"}) {
		t.Fatalf("deploy/launchd has %v, want the node's and mlx_lm.server's plists", files)
	}

	node := readLaunchAgent(t, "dev.shoal.node.plist")
	if len(node.argv) < 2 || path.Base(node.argv[0]) != "shoal" || node.argv[1] != "node" {
		t.Errorf("the node runs %q, want an absolute path to shoal and then node", node.argv)
	} else if err := accepts(node.argv[1:]); err != nil {
		t.Errorf("the node: %v", err)
	}
	for k := range node.env {
		if strings.HasPrefix(k, "SHOAL_") && !envNames(t, "node")[k] {
			t.Errorf("the node's environment sets %s, which shoal node does not read", k)
		}
	}
	for flag, scheme := range map[string]string{"nats": "nats", "mcp-url": "http"} {
		if u, err := url.Parse(flagValue(node.argv, flag)); err != nil || u.Scheme != scheme || !isLoopback(u.Hostname()) {
			t.Errorf("the node's --%s %q, want a %s:// URL on loopback (the SSH tunnel's end)", flag, flagValue(node.argv, flag), scheme)
		}
	}
	if flagValue(node.argv, "node-name") == "" {
		t.Error("the node has no --node-name: it would take the host name")
	}
	if !slices.Contains(strings.Split(node.env["PATH"], ":"), "/opt/homebrew/bin") {
		t.Errorf("the node's PATH=%q lacks /opt/homebrew/bin, where claude and opencode are on an Apple machine", node.env["PATH"])
	}

	mlx := readLaunchAgent(t, "dev.shoal.mlx.plist")
	if path.Base(mlx.argv[0]) != "mlx_lm.server" {
		t.Errorf("dev.shoal.mlx.plist runs %q, not mlx_lm.server", mlx.argv)
	}
	host, port := flagValue(mlx.argv, "host"), flagValue(mlx.argv, "port")
	if !isLoopback(host) {
		t.Errorf("mlx_lm.server listens on %q, not on loopback only", host)
	}
	if flagValue(mlx.argv, "model") == "" {
		t.Errorf("mlx_lm.server is given no --model: %q", mlx.argv)
	}
	vmlx, err := url.Parse(node.env["VMLX_HOST"])
	if err != nil || vmlx.Scheme != "http" || vmlx.Hostname() != host || vmlx.Port() != port || port == "" {
		t.Errorf("the node's VMLX_HOST=%q is not mlx_lm.server's http://%s:%s", node.env["VMLX_HOST"], host, port)
	}
}

// The plist parser refuses what launchd would not read.
func TestParsePlistRefuses(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		`<dict/>`,
		`<plist version="1.0"><dict><key>A</key></dict></plist>`,
		`<plist version="1.0"><dict><key>A</key><string>x</string><key>A</key><true/></dict></plist>`,
		`<plist version="1.0"><dict><string>A</string><true/></dict></plist>`,
		`<plist version="1.0"><dict><key>A</key><bool>yes</bool></dict></plist>`,
		`<plist version="1.0"><dict/><dict/></plist>`,
		`<plist version="1.0"><dict><key>A</key><string>x</dict></plist>`,
	} {
		if _, err := parsePlist(strings.NewReader(bad)); err == nil {
			t.Errorf("parsePlist accepted %s", bad)
		}
	}
}
