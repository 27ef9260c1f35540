package deploy_test

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
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

// The launchd plist is a valid property list that runs `shoal node` from
// an absolute path, at load and kept alive, with the coordinator's
// address and the MLX server's in its environment.
func TestLaunchdPlist(t *testing.T) {
	t.Parallel()
	f, err := os.Open("launchd/dev.shoal.node.plist")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	top, err := parsePlist(f)
	if err != nil {
		t.Fatalf("plist: %v", err)
	}
	if top.name != "dict" {
		t.Fatalf("the plist holds a <%s>, not a <dict>", top.name)
	}
	if l := top.entry("Label"); l == nil || l.name != "string" || l.text != "dev.shoal.node" {
		t.Errorf("Label: %+v, want the string dev.shoal.node (the file's name)", l)
	}

	args := top.entry("ProgramArguments")
	if args == nil || args.name != "array" {
		t.Fatalf("ProgramArguments: %+v, want an <array>", args)
	}
	var argv []string
	for _, a := range args.kids {
		if a.name != "string" {
			t.Errorf("ProgramArguments holds a <%s>, not a <string>", a.name)
		}
		argv = append(argv, a.text)
	}
	if len(argv) < 2 || !path.IsAbs(argv[0]) || path.Base(argv[0]) != "shoal" || argv[1] != "node" {
		t.Errorf("ProgramArguments %q, want an absolute path to shoal and then node", argv)
	}
	if top.entry("Program") != nil {
		t.Error("Program is set too; launchd would run it instead of ProgramArguments[0]")
	}

	// KeepAlive: always (<true/>), or a dict that at least restarts on a
	// failure (SuccessfulExit false).
	switch k := top.entry("KeepAlive"); {
	case k == nil:
		t.Error("no KeepAlive: launchd would not restart a node that stops")
	case k.name == "true":
	case k.name == "dict":
		if s := k.entry("SuccessfulExit"); s == nil || s.name != "false" {
			t.Errorf("KeepAlive is a dict without SuccessfulExit <false/>: %+v", k.kids)
		}
	default:
		t.Errorf("KeepAlive is <%s/>, so the node is not kept alive", k.name)
	}
	if r := top.entry("RunAtLoad"); r == nil || r.name != "true" {
		t.Errorf("RunAtLoad: %+v, want <true/>", r)
	}

	env := top.entry("EnvironmentVariables")
	if env == nil || env.name != "dict" {
		t.Fatalf("EnvironmentVariables: %+v, want a <dict>", env)
	}
	vars := map[string]string{}
	for i := 0; i+1 < len(env.kids); i += 2 {
		if v := env.kids[i+1]; v.name != "string" {
			t.Errorf("the variable %s is a <%s>, not a <string>", env.kids[i].text, v.name)
		} else {
			vars[env.kids[i].text] = v.text
		}
	}
	for name, scheme := range map[string]string{"SHOAL_NATS": "nats", "VMLX_HOST": "http"} {
		if u, err := url.Parse(vars[name]); err != nil || u.Scheme != scheme || u.Host == "" {
			t.Errorf("%s=%q, want a %s:// URL", name, vars[name], scheme)
		}
	}
	if vars["SHOAL_NODE_NAME"] == "" {
		t.Error("no SHOAL_NODE_NAME: the node would take the host name")
	}
	if !slices.Contains(strings.Split(vars["PATH"], ":"), "/opt/homebrew/bin") {
		t.Errorf("PATH=%q lacks /opt/homebrew/bin, where claude and opencode are on an Apple machine", vars["PATH"])
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
