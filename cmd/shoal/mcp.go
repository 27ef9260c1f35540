package main

import (
	"context"
	"flag"

	"github.com/shoalfabric/shoal/bridge"
)

func mcpCommand() *command {
	return &command{
		name:    "mcp",
		summary: "serve the MCP tools on stdin and stdout",
		help: `
Serves Shoal's MCP tools over stdio, for an MCP client such as Claude
Code: Kaimon's nine (agent_open, agent_send, agent_run, agent_output,
agent_status, agent_set_model, agent_list, agent_interrupt, agent_close)
and Shoal's own: agent_nodes, agent_events, agent_pending, agent_permit,
and, for agents on a repository, agent_diff, agent_fetch and agent_job
(those, and agent_open with repo, need the coordinator's credentials, and
read and write repositories of this machine).

    claude mcp add shoal -- shoal mcp --nats nats://127.0.0.1:4222`,
		flags: func(fs *flag.FlagSet) runner {
			var c clientOptions
			c.register(fs)
			return func(ctx context.Context, env *environment, _ []string) error {
				f, closeConn, err := c.fabric(env)
				if err != nil {
					return err
				}
				defer closeConn()
				m := bridge.NewMCP(bridge.MCPConfig{Client: f, Version: semver()})
				return m.ServeStdio(ctx, env.io.in, env.io.out)
			}
		},
	}
}
