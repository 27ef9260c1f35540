package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

func completionCommand() *command {
	return &command{
		name:    "completion",
		args:    "bash|zsh|fish",
		summary: "print a shell completion script",
		help: `
Prints a completion script for the shell, covering every command and each
command's flags, made from the commands this binary has:

    source <(shoal completion bash)                  # in ~/.bashrc
    shoal completion zsh > "${fpath[1]}/_shoal"      # then compinit
    shoal completion fish > ~/.config/fish/completions/shoal.fish`,
		flags: func(fs *flag.FlagSet) runner {
			var words string
			var conn clientOptions
			fs.StringVar(&words, "words", "", "print the words the bash script completes from the running fabric: `kind` agents, nodes or presets")
			conn.registerConn(fs)
			return func(ctx context.Context, env *environment, args []string) error {
				if words != "" {
					return completionWords(ctx, env, &conn, words)
				}
				if len(args) != 1 {
					return usagef("give one shell: bash, zsh or fish")
				}
				write, ok := completionScripts[args[0]]
				if !ok {
					return usagef("no completion for %q: bash, zsh or fish%s", args[0], didYouMean(args[0], []string{"bash", "zsh", "fish"}, ""))
				}
				return write(env.io.out, completionTable())
			}
		},
	}
}

// completionWords prints the agent ids, node names or presets a script
// completes from; the fabric is asked briefly, and nothing is printed
// when it does not answer (a completion never hangs a shell).
func completionWords(ctx context.Context, env *environment, conn *clientOptions, kind string) error {
	var out []string
	switch kind {
	case "presets":
		for _, p := range schemas.Presets {
			out = append(out, string(p))
		}
		out = append(out, "ask")
	case "agents", "nodes":
		conn.timeout = 2 * time.Second
		f, closeConn, err := conn.fabric(env)
		if err != nil {
			return nil
		}
		defer closeConn()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if kind == "agents" {
			recs, _ := f.List(ctx)
			for _, r := range recs {
				out = append(out, r.ID)
			}
		} else {
			nodes, _ := f.Nodes(ctx)
			for _, n := range nodes {
				out = append(out, n.Name)
			}
		}
	default:
		return usagef("--words %q: agents, nodes or presets", kind)
	}
	_, err := fmt.Fprintln(env.io.out, strings.Join(out, "\n"))
	return err
}

var completionScripts = map[string]func(io.Writer, []completedCommand) error{
	"bash": bashCompletion,
	"zsh":  zshCompletion,
	"fish": fishCompletion,
}

// completedCommand is what completion offers for one command.
type completedCommand struct {
	name, summary string
	flags         []completedFlag
	words         []string // its arguments, when they are from a fixed set
	agents        bool     // its first argument is an agent id
}

type completedFlag struct {
	name, placeholder, usage string
	value                    bool // it takes a value
	files                    bool // the value is a file or directory
}

// completionTable is every command and its visible flags, from the
// command table itself.
func completionTable() []completedCommand {
	var out []completedCommand
	for _, c := range commands() {
		fs, _, _ := c.flagSet()
		cc := completedCommand{name: c.name, summary: c.summary,
			agents: strings.HasPrefix(c.args, "<agent>") || strings.HasPrefix(c.args, "[agent")}
		names := c.visibleFlags(fs)
		sort.Strings(names)
		for _, name := range names {
			f := fs.Lookup(name)
			typ, usage := flag.UnquoteUsage(f)
			cc.flags = append(cc.flags, completedFlag{
				name: name, placeholder: typ, usage: firstClause(usage), value: typ != "",
				files: typ == "file" || typ == "path" || typ == "directory",
			})
		}
		switch c.name {
		case "config":
			cc.words = commandNames()
			cc.words = cc.words[:len(cc.words)-1] // not help
		case "completion":
			cc.words = []string{"bash", "zsh", "fish"}
		}
		out = append(out, cc)
	}
	help := completedCommand{name: "help", summary: "show a command's help"}
	for _, c := range out {
		help.words = append(help.words, c.name)
	}
	return append(out, help)
}

// firstClause shortens a flag's usage for a completion menu.
func firstClause(usage string) string {
	if i := strings.IndexAny(usage, ";("); i > 0 {
		usage = usage[:i]
	}
	usage = strings.TrimSpace(usage)
	if r := []rune(usage); len(r) > 70 {
		usage = string(r[:67]) + "..."
	}
	return usage
}

func flagWords(fl []completedFlag, value bool) string {
	var out []string
	for _, f := range fl {
		if !value || f.value {
			out = append(out, "--"+f.name)
		}
	}
	return strings.Join(out, " ")
}

func bashCompletion(w io.Writer, cmds []completedCommand) error {
	var names []string
	for _, c := range cmds {
		names = append(names, c.name)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# bash completion for shoal, made by: shoal completion bash
_shoal() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    if ((COMP_CWORD == 1)); then
        mapfile -t COMPREPLY < <(compgen -W '%s' -- "$cur")
        return
    fi
    local flags="" valued="" words=""
    case ${COMP_WORDS[1]} in
`, strings.Join(names, " "))
	for _, c := range cmds {
		agents := ""
		if c.agents {
			agents = "1"
		}
		fmt.Fprintf(&b, "    %s)\n        flags='%s'\n        valued='%s'\n        words='%s'\n        agents='%s'\n        ;;\n",
			c.name, flagWords(c.flags, false), flagWords(c.flags, true), strings.Join(c.words, " "), agents)
	}
	b.WriteString(`    esac
    # Node names, presets and agent ids come from the running fabric.
    case $prev in
    --node)
        mapfile -t COMPREPLY < <(compgen -W "$(shoal completion --words nodes 2>/dev/null)" -- "$cur")
        return ;;
    --permission)
        mapfile -t COMPREPLY < <(compgen -W "$(shoal completion --words presets 2>/dev/null)" -- "$cur")
        return ;;
    esac
    # After another flag that takes a value, leave it to the default
    # completion.
    if [[ $prev == --* && " $valued " == *" $prev "* ]]; then
        COMPREPLY=()
        return
    fi
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$flags" -- "$cur")
    elif [[ -n $words ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
    elif [[ -n $agents ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(shoal completion --words agents 2>/dev/null)" -- "$cur")
    else
        COMPREPLY=()
    fi
}
complete -o default -F _shoal shoal
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// zshQuote quotes s for zsh in single quotes.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// zshSpec escapes the characters _arguments gives a meaning to.
func zshSpec(s string) string {
	return strings.NewReplacer(`\`, `\\`, `[`, `\[`, `]`, `\]`, `:`, `\:`).Replace(s)
}

func zshCompletion(w io.Writer, cmds []completedCommand) error {
	var b strings.Builder
	b.WriteString(`#compdef shoal
# zsh completion for shoal, made by: shoal completion zsh
_shoal() {
    local -a commands specs
    commands=(
`)
	for _, c := range cmds {
		fmt.Fprintf(&b, "        %s\n", zshQuote(c.name+":"+strings.ReplaceAll(c.summary, ":", `\:`)))
	}
	b.WriteString(`    )
    if (( CURRENT == 2 )); then
        _describe -t commands 'shoal command' commands
        return
    fi
    case $words[2] in
`)
	for _, c := range cmds {
		fmt.Fprintf(&b, "    %s)\n        specs=(\n", c.name)
		for _, f := range c.flags {
			spec := "--" + f.name + "[" + zshSpec(f.usage) + "]"
			if f.value {
				action := " "
				if f.files {
					action = "_files"
				}
				spec += ":" + zshSpec(f.placeholder) + ":" + action
			}
			fmt.Fprintf(&b, "            %s\n", zshQuote(spec))
		}
		if len(c.words) > 0 {
			fmt.Fprintf(&b, "            %s\n", zshQuote("*:argument:("+strings.Join(c.words, " ")+")"))
		} else {
			fmt.Fprintf(&b, "            %s\n", zshQuote("*:argument:_files"))
		}
		b.WriteString("        )\n        ;;\n")
	}
	b.WriteString(`    esac
    shift words
    (( CURRENT-- ))
    _arguments -S $specs
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _shoal "$@"
else
    compdef _shoal shoal
fi
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// fishQuote quotes s for fish in single quotes.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func fishCompletion(w io.Writer, cmds []completedCommand) error {
	var b strings.Builder
	b.WriteString(`# fish completion for shoal, made by: shoal completion fish
function __shoal_needs_command
    test (count (commandline -opc)) -eq 1
end
function __shoal_command
    set -l words (commandline -opc)
    test (count $words) -ge 2; and test $words[2] = $argv[1]
end
complete -c shoal -e
`)
	for _, c := range cmds {
		fmt.Fprintf(&b, "complete -c shoal -n __shoal_needs_command -f -a %s -d %s\n", fishQuote(c.name), fishQuote(c.summary))
	}
	for _, c := range cmds {
		cond := fishQuote("__shoal_command " + c.name)
		for _, f := range c.flags {
			line := fmt.Sprintf("complete -c shoal -n %s -l %s", cond, fishQuote(f.name))
			switch {
			case f.files:
				line += " -r -F"
			case f.value:
				line += " -x"
			}
			fmt.Fprintf(&b, "%s -d %s\n", line, fishQuote(f.usage))
		}
		if len(c.words) > 0 {
			fmt.Fprintf(&b, "complete -c shoal -n %s -f -a %s\n", cond, fishQuote(strings.Join(c.words, " ")))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
