package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// printCommandHelp prints the command's usage, its help, and its flags by
// topic: each with its placeholder, its usage and default, and for a
// setting its environment variable.
func printCommandHelp(w io.Writer, c *command) {
	fs, _, _ := c.flagSet()
	usage := "shoal " + c.name + " [flags]"
	switch {
	case c.direct != nil:
		usage = "shoal " + c.name + " " + c.args
	case c.args != "":
		usage += " " + c.args
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", usage, strings.TrimSpace(c.help))
	settings := false
	for _, g := range c.groups() {
		var present []*flag.Flag
		for _, name := range g.flags {
			if f := fs.Lookup(name); f != nil {
				present = append(present, f)
			}
		}
		if len(present) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, f := range present {
			fmt.Fprint(w, flagHelp(f))
			if g.setting {
				fmt.Fprintf(w, "      env SHOAL_%s\n", envName(f.Name))
				settings = true
			}
		}
	}
	for _, name := range c.visibleFlags(fs) {
		for _, old := range c.oldNames(name) {
			fmt.Fprintf(w, "\n--%s (and SHOAL_%s) is the old spelling of --%s, still read.\n", old, envName(old), name)
		}
	}
	if settings {
		fmt.Fprintf(w, "\nThe flags with an env line are settings: also read from the config file\nand from that variable (flags win); see shoal config %s.\n", c.name)
	}
}

// flagHelp is one flag's entry: its name and placeholder, then its usage
// with its one default.
func flagHelp(f *flag.Flag) string {
	typ, usage := flag.UnquoteUsage(f)
	head := "  --" + f.Name
	if typ != "" {
		head += " " + typ
	}
	if d := shownDefault(f); d != "" {
		usage += " (default " + d + ")"
	}
	return head + "\n      " + usage + "\n"
}

// shownDefault is the default help adds to a flag's usage: none when the
// usage says its default itself (one computed at run time, or a sentinel
// like -1 that means "the latest"), or the value is a zero that means
// "off" or "none".
func shownDefault(f *flag.Flag) string {
	if strings.Contains(f.Usage, "(default") {
		return ""
	}
	switch f.DefValue {
	case "", "false", "0", "0s":
		return ""
	}
	return f.DefValue
}
