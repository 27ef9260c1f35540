// Package render turns a stream of agent events into what a person
// watching an agent wants to see in a terminal, as `shoal tail` prints it:
//
//	── turn 2 ──
//	» fix the failing test
//	💭 thinking…
//	Let me look at the test first.
//	▶ Bash  go test ./...
//	↳ failed  --- FAIL: TestParse (0.00s)  (+4 lines)
//	▶ Edit  /src/parse.go
//	↳ completed  edit /src/parse.go
//	Fixed: the parser now accepts empty input.
//	── turn 2 ended: end_turn · 777 in / 19 out · cache 10 read ──
//
// Assistant text flows as it streams: each delta is written on the current
// line as it arrives, and the authoritative copy that follows the deltas
// only ends the line (or, when a delta was lost, supplies what is missing).
// Each tool call gets one ▶ line, printed when its input is known, and one
// ↳ line when it completes or fails; input fragments print nothing. Turn
// boundaries, usage, errors, permissions, plans and lifecycle ends get a
// line each; idle/working status and running usage updates are implied and
// print nothing.
//
// One-line summaries are truncated to Options.Width; streamed text is not.
// Control characters and terminal escape sequences in agent or tool output
// are removed, so with Options.Color false the output is plain text. With
// Options.Prefix every line starts with "[agentID] ", and when two agents'
// streamed text interleaves, one agent's open line is ended before the
// other's text is written.
//
// A Printer is not safe for concurrent use; feed it from one goroutine.
package render
