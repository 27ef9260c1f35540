// Command shoal runs and drives the Shoal agent fabric: the coordinator
// (shoal up), agent-host nodes, and the client verbs. Flags, environment
// variables and config files are read here and nowhere else.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/bench"
	"github.com/shoalfabric/shoal/node/proc"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case proc.KeeperArg: // this process holds one agent for a node (macOS)
			os.Exit(proc.RunKeeper(os.Args[2:]))
		case proc.ReaperArg: // this process holds a node's agents (Linux)
			os.Exit(proc.RunReaper())
		case proc.SandboxArg: // this process confines itself, then becomes an agent
			os.Exit(proc.RunSandbox(os.Args[2:]))
		case proc.SandboxInitArg: // the first process of an agent's namespaces
			os.Exit(proc.RunSandboxInit(os.Args[2:]))
		case bench.StandinArg: // this process is shoal bench's stand-in claude CLI
			os.Exit(bench.RunStandin(os.Args[2:]))
		case bench.FloorArg: // this process is a floor round of shoal bench
			os.Exit(bench.RunFloor(os.Args[2:]))
		}
	}
	proc.PassNothingOn() // nothing a caller left open reaches the agents
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals()...)
	context.AfterFunc(ctx, stopAtOnceOnASecondSignal)
	endProfile := cpuProfile(os.Getenv(envCPUProfile))
	code := run(ctx, os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}, os.Getenv)
	endProfile()
	stop()
	os.Exit(code)
}

// stopSignals are the signals that stop a command cleanly, as Ctrl-C
// does: SIGINT, SIGTERM, and SIGHUP (its terminal closed, an SSH session
// dropped), which killed it at once, leaving what it was making (a
// bundle being written, a job's agent holding its slot). A process
// started with SIGHUP ignored (nohup) keeps ignoring it.
func stopSignals() []os.Signal {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}

// stopAtOnceOnASecondSignal makes a second Ctrl-C (or SIGTERM) end a
// process that is stopping, without its clean stop: a node waiting for a
// fabric that is away need not be waited for. It leaves what a kill
// leaves: a node's journal keeps the events not yet stored, and its next
// start settles the rest.
func stopAtOnceOnASecondSignal() {
	again := make(chan os.Signal, 1)
	signal.Notify(again, stopSignals()...)
	go func() {
		s := <-again
		name := "interrupt"
		switch s {
		case syscall.SIGTERM:
			name = "terminate"
		case syscall.SIGHUP:
			name = "hangup"
		}
		fmt.Fprintf(os.Stderr, "shoal: %s again: stopping at once\n", name)
		os.Exit(exitInterrupted)
	}()
}

// envCPUProfile names a file that gets a Go CPU profile of the command,
// from its start to its end (for `go tool pprof`); shoal bench --profile
// sets it for the node it starts.
const envCPUProfile = "SHOAL_CPUPROFILE"

// cpuProfile starts a CPU profile into path and returns what ends it; a
// profile that cannot start is said on stderr and the command runs on.
func cpuProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shoal: %s=%s: no CPU profile: %v\n", envCPUProfile, path, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
