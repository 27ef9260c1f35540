// Package tui is `shoal tui`: a terminal monitor of every agent of the
// fabric and of its nodes that a person can act from. It owns the screen
// (the agent list, the selected agent's feed, its transcript, the nodes
// view, the popups that ask before acting) and the live feed's follower,
// which reconnects after a lost connection and resumes where it was. It
// reads and acts through a Source, which cmd/shoal backs with the fabric
// client.
package tui
