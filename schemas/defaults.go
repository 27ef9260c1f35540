package schemas

import "time"

// Kaimon's defaults, in one place for every surface (MCP tools, the CLI,
// the nodes).
const (
	// DefaultModel is the model of an agent opened without one.
	DefaultModel = "sonnet"
	// DefaultRunTimeout is agent_run's timeout when the caller gives none.
	DefaultRunTimeout = 600 * time.Second
	// MaxRunTimeout is the longest agent_run timeout Shoal accepts.
	MaxRunTimeout = 24 * time.Hour
	// DefaultMaxChars is agent_output's max_chars when the caller gives none.
	DefaultMaxChars = 20000
	// OpenTimeout bounds an open at its node: an agent that has not
	// started by then (an ACP handshake that never answers) is dead, and
	// its stream says why.
	OpenTimeout = 2 * time.Minute
	// MaxEventsAhead is how far ahead of an agent's last stored event a
	// node's next event may be numbered: its events in flight. The relay
	// refuses an event numbered further ahead, unless it is a node's
	// error naming the numbers it lost.
	MaxEventsAhead = 4096
)

// RunTimeout reads agent_run's timeout in seconds: zero means
// DefaultRunTimeout; anything else must be more than 0 and at most
// MaxRunTimeout.
func RunTimeout(seconds float64) (time.Duration, error) {
	switch {
	case seconds == 0:
		return DefaultRunTimeout, nil
	case !(seconds > 0 && seconds <= MaxRunTimeout.Seconds()):
		return 0, Errf(CodeInvalid, "timeout must be more than 0 and at most %d seconds (24 hours), got %v", int(MaxRunTimeout.Seconds()), seconds)
	}
	return time.Duration(seconds * float64(time.Second)), nil
}
