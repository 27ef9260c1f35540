// Command shoal runs and drives the Shoal agent fabric: the coordinator
// (shoal up), agent-host nodes, and the client verbs. Flags, environment
// variables and config files are read here and nowhere else.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/bench"
	"github.com/shoalfabric/shoal/node/backend"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case backend.KeeperArg: // this process holds one agent for a node (macOS)
			os.Exit(backend.RunKeeper(os.Args[2:]))
		case backend.ReaperArg: // this process holds a node's agents (Linux)
			os.Exit(backend.RunReaper())
		case backend.SandboxArg: // this process confines itself, then becomes an agent
			os.Exit(backend.RunSandbox(os.Args[2:]))
		case bench.StandinArg: // this process is shoal bench's stand-in claude CLI
			os.Exit(bench.RunStandin(os.Args[2:]))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}, os.Getenv)
	stop()
	os.Exit(code)
}
