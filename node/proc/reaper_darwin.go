//go:build darwin

package proc

import "io"

// A Reaper holds the processes of a node's agents, so that everything an
// agent starts ends with the agent and with its node. macOS has no child
// subreaper and no parent-death signal: each agent process is held by its
// own keeper (RunKeeper), a copy of the shoal binary with a lifeline to
// the node, which marks the agent's processes with a token in their
// environment and kills its group and every process carrying the token
// when the agent exits or the node dies.
type Reaper struct{ keeper []string }

// StartReaper prepares the keepers of a node: exe is a binary that runs
// RunKeeper when given KeeperArg (a shoal binary).
func StartReaper(exe string) (*Reaper, error) {
	return &Reaper{keeper: []string{exe, KeeperArg}}, nil
}

// Done is never closed: there is no reaper process to exit.
func (r *Reaper) Done() <-chan struct{} { return nil }

// PID is 0: there is no reaper process, one keeper per agent instead.
func (r *Reaper) PID() int { return 0 }

// Gone reports whether the reaper has exited; on macOS there is no reaper
// process.
func (r *Reaper) Gone() bool { return false }

// Close does nothing: each keeper ends with its agent.
func (r *Reaper) Close() error { return nil }

func (r *Reaper) start(spec ProcessSpec) (*Process, io.ReadCloser, error) {
	return startDirect(spec, r.keeper)
}

// ReaperArg names the reaper process on Linux; macOS has none.
const ReaperArg = "__reaper"

// RunReaper is Linux's; on macOS it only says so.
func RunReaper() int {
	println("reaper: macOS holds agents with keepers, not a reaper")
	return 2
}
