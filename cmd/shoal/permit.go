package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

func permitCommand() *command {
	return verbCommand("permit", "<agent> <request> allow|deny", "answer a permission request an agent waits on",
		`Answers a permission request of an agent opened with --permission ask (or
--ask): allow lets the tool run, deny refuses it, with --message said to
the agent. --option picks one of the agent's own options (an ACP agent's
allow_always, say). Only the first answer counts: a second is refused
(exit 6) naming who answered. shoal pending lists the open requests.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var message, option, input string
			fs.StringVar(&message, "message", "", "`text` said to the agent with a denial")
			fs.StringVar(&option, "option", "", "one of the request's own `options`, as shoal pending --json lists them: ACP agents offer theirs (such as allow_always); claude requests offer none")
			fs.StringVar(&input, "input", "", "the tool's input as a JSON `object` to run it with instead, with allow (claude agents)")
			return func(ctx context.Context, v *verb, args []string) error {
				id, rest, err := agentArg(args, "the agent id")
				if err != nil {
					return err
				}
				if len(rest) != 2 {
					return usagef("give the agent id, the request id and allow or deny")
				}
				d, err := schemas.ParseDecision(rest[1])
				if err != nil {
					return usagef("%v", err)
				}
				if input != "" && !json.Valid([]byte(input)) {
					return usagef("--input %q is not JSON", input)
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				by := "cli"
				if u, err := user.Current(); err == nil {
					by = "cli:" + u.Username
				}
				req := schemas.PermitRequest{AgentID: id, RequestID: rest[0], Decision: d, Option: option, Message: message, By: by}
				if input != "" {
					req.Input = json.RawMessage(input)
				}
				rep, err := f.Permit(ctx, req)
				if err != nil {
					return err
				}
				return v.reply(rep, fmt.Sprintf("%s: %s %s", rest[0], d, rep.Record.Tool))
			}
		})
}

func pendingCommand() *command {
	return verbCommand("pending", "", "list the permission requests agents wait on",
		`Lists every permission request an agent of the fabric waits on, oldest
first: the agent, the request id (for shoal permit), the tool, how long
it has waited and its input. --json prints the requests in full.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				if len(args) > 0 {
					return usagef("pending takes no arguments")
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				rep, err := f.Pending(ctx)
				if err != nil {
					return err
				}
				if v.json {
					return printJSON(v.env, rep)
				}
				reqs := rep.Requests
				if len(reqs) == 0 && rep.Omitted == 0 {
					fmt.Fprintln(v.out(), "no permission request is waiting")
					return nil
				}
				w := tabwriter.NewWriter(v.text(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "AGENT\tREQUEST\tTOOL\tWAITING\tINPUT")
				for _, r := range reqs {
					asked := time.Unix(0, int64(r.AskedAt*1e9))
					input := strings.Join(strings.Fields(schemas.Readable(r.Input, false)), " ")
					if len(input) > 80 {
						input = input[:77] + "..."
					}
					// Each cell on one line: a tool's name is what the agent
					// says (gemini names a shell call by its command), and a
					// newline or a tab in it would make rows of its own.
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.AgentID, oneLine(r.RequestID), oneLine(r.Tool), time.Since(asked).Round(time.Second), input)
				}
				if err := w.Flush(); err != nil {
					return err
				}
				if rep.Omitted > 0 {
					fmt.Fprintf(v.out(), "%d more requests wait, not listed: all of them would not fit in one reply of the fabric service (each agent's oldest are listed first); answer some and list again\n", rep.Omitted)
				}
				return nil
			}
		})
}
