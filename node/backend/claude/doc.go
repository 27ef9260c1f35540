// Package claude drives the claude CLI (Claude Code) in headless
// multi-turn stream-json mode and maps its output onto Shoal's events.
//
// Everything particular to the CLI lives here: its argv, how a turn is
// written and interrupted, the stop ladder it needs (close stdin, SIGINT,
// SIGTERM, SIGKILL), and the decoding of every stream-json line.
package claude
